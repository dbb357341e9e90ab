"""Serving configs: what an engine is actually launched with.

`read_serving_config(path)` returns a `ServingConfig`: the engine, the target and drafter,
the engine's own method name, K, how it drafts (greedy | probabilistic, where the config
says), the sampling it applies to requests that set none, and the engine's knobs. The
shapes each engine accepts, read from its argument parser:

vLLM (vllm/config/speculative.py, vllm/engine/arg_utils.py, vllm/utils/argparse_utils.py)
  the `--speculative-config` JSON {"method", "model", "num_speculative_tokens",
  "draft_sample_method": "greedy" | "probabilistic", …}; a `vllm serve --config` YAML
  (`model:`, `speculative-config:` as a mapping or as that JSON string,
  `override-generation-config:`, the shorthands `spec-method/-model/-tokens:` and the
  older `speculative-model:` / `num-speculative-tokens:`); a command line — `vllm serve
  MODEL` or `python -m vllm.entrypoints.openai.api_server --model MODEL` with
  `--speculative-config '{…}'`, `-sc`, `--speculative-config={…}`, the dotted
  `--speculative-config.num_speculative_tokens 3`, `--spec-method/--spec-model/--spec-tokens`,
  `--speculative-model/--num-speculative-tokens`, `--override-generation-config`, `--config`.
SGLang (python/sglang/srt/server_args.py)
  a `--config` YAML or a `python -m sglang.launch_server` command line: --model-path
  (--model), --speculative-algorithm, --speculative-draft-model-path (-model),
  --speculative-num-steps (K, the chain depth), --speculative-eagle-topk,
  --speculative-num-draft-tokens, --speculative-accept-threshold-single/-acc,
  --speculative-use-rejection-sampling (drafts sampled, accepted by rejection
  sampling), --preferred-sampling-params '{"temperature": …}'.
llama.cpp (common/arg.cpp, docs/speculative.md)
  a llama-server command line in a launch script or an args file: -m/--model,
  -md/--model-draft/--spec-draft-model, -hf/-hfd, --spec-type, --spec-draft-n-max (K),
  --spec-draft-n-min, --spec-draft-p-min, --spec-draft-p-split, and the older
  --draft-max/--draft/--draft-n, --draft-min/--draft-n-min, --draft-p-min, --draft-p-split;
  --temp/--temperature, --top-k, --top-p, --min-p; `--flag value` or `--flag=value`; the
  LLAMA_ARG_* variables of a script's `export`, of a command's env prefix or of an env file
  (a flag on the command line wins: llama-server reads the environment first).
TensorRT-LLM (tensorrt_llm/llmapi/llm_args.py)
  the YAML of `trtllm-serve --extra_llm_api_options` with `speculative_config:
  {decoding_type: Eagle3 | Eagle | MTP | Medusa | DraftTarget | NGram | …, max_draft_len,
  speculative_model}`; a trtllm-serve command line is read through the YAML it names.

Every number is held to the bounds of the setting it is (`settings.model.check`: K as
--k, a temperature as --temperature) or of the engine's knob, and refused naming where it
was written, `FILE: key` with the key as the file spells it (`launch.sh: --spec-draft-p-min`,
`serve.yaml: speculative-config.num_speculative_tokens`); `ServingConfig.places` names
the same place for each value the merge takes, so its origins do too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.engines import PROBABILISTIC, get
from specprobe.settings.config import normalise_keys, read_mapping, read_text
from specprobe.settings.model import BY_NAME, SAMPLING, Setting, check, check_bounds

# the one bounds check, for knobs that are no setting of specprobe's own
from specprobe.settings.shell import ASSIGN, NAME, Command, commands, is_flag, split_flags

VLLM, SGLANG, LLAMA_CPP, TRTLLM = "vllm", "sglang", "llama.cpp", "trtllm"

# Engine method names → specprobe drafter kinds (None: no model drafter, e.g. n-gram).
_VLLM_KINDS = {
    "draft_model": "independent",
    "eagle": "eagle",
    "eagle3": "eagle3",
    "medusa": "medusa",
    "mlp_speculator": "independent",
    "mtp": "mtp",
    "deepseek_mtp": "mtp",
    "ernie_mtp": "mtp",
    "qwen3_next_mtp": "mtp",
    "mimo_mtp": "mtp",
    "glm4_moe_mtp": "mtp",
    "longcat_flash_mtp": "mtp",
    "ngram": None,
    "ngram_gpu": None,
    "suffix": None,
}
_SGLANG_KINDS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "STANDALONE": "independent", "NEXTN": "mtp", "MTP": "mtp", "NGRAM": None, "LOOKAHEAD": None, "DFLASH": None}
_LLAMA_KINDS = {"draft-simple": "independent", "draft": "independent", "draft-eagle3": "eagle3", "draft-mtp": "mtp", "draft-dflash": None, "draft-dspark": None}
# TensorRT-LLM's PyTorch backend runs "Eagle" as EAGLE-3 (its spec_dec_mode is EAGLE3)
_TRTLLM_KINDS = {"eagle3": "eagle3", "eagle": "eagle3", "mtp": "mtp", "medusa": "medusa", "drafttarget": "independent", "draft_target": "independent"}
# a specprobe drafter spec for each kind ({} the engine's drafter path)
_SPEC_OF_KIND = {"independent": "{}", "eagle3": "eagle3:{}", "eagle": "eagle:{}", "medusa": "medusa:{}"}

_TARGET_SAMPLING = tuple(k for k in SAMPLING if not k.startswith("draft_"))  # as engines spell them

# engine knobs that are no setting of specprobe's, bounded as the engine takes them
_KNOBS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("p_min", "p_min", "llama.cpp: stop a draft below this drafter probability", float, ge=0, le=1, hint="a probability in [0, 1]"),
        Setting("p_split", "p_split", "llama.cpp: split probability", float, ge=0, le=1, hint="a probability in [0, 1]"),
        Setting("n_min", "n_min", "llama.cpp: fewest draft tokens worth verifying", int, ge=0, hint="a count of draft tokens, 0 or more"),
        Setting("topk", "topk", "SGLang: candidates per draft step", int, ge=1, hint="a positive number of candidates per step"),
        Setting("num_draft_tokens", "num_draft_tokens", "SGLang: draft tokens in the tree", int, ge=1, hint="a positive number of draft tokens"),
        Setting("threshold_single", "threshold_single", "SGLang: accept above this target probability", float, ge=0, le=1, hint="a probability in [0, 1] (SGLang's default is 1)"),
        Setting("threshold_acc", "threshold_acc", "SGLang: raise acceptance to p / threshold", float, gt=0, le=1, hint="a number in (0, 1] (SGLang's default is 1)"),
        Setting("draft_tokens", "draft_tokens", "TensorRT-LLM: draft tokens in the tree", int, ge=1, hint="a positive number of draft tokens"),
        Setting("context_length", "context_length", "the longest sequence the engine serves", int, ge=1, hint="a positive number of tokens"),
    )
}


@dataclass(frozen=True)
class ServingConfig:
    """What a serving config says about speculative decoding."""

    engine: str  # vllm | sglang | llama.cpp | trtllm (as --engine takes it)
    source: Path
    target: str | None
    drafter: str | None  # the engine's draft model / head path or name (None for n-gram methods)
    method: str | None  # the engine's own name: "eagle3", "draft_model", "EAGLE3", "draft-simple", "Eagle3"
    drafter_kind: str | None  # independent | eagle | eagle3 | medusa | mtp | None
    num_speculative_tokens: int | None  # K: draft tokens proposed per step (chain depth)
    sampling: dict[str, float] = field(default_factory=dict)  # target-side sampling found
    draft_sampling: dict[str, float] = field(default_factory=dict)  # drafter-side, when set apart
    extra: dict[str, Any] = field(default_factory=dict)  # engine knobs (topk, num_draft_tokens, p_min, …)
    drafting: str | None = None  # greedy | probabilistic when the config says; None: the engine's own
    context_length: int | None = None  # the longest sequence it serves (max_model_len, context-length, -c, max_seq_len)
    # the KV-cache dtypes as the engine spells them (vLLM's --kv-cache-dtype and
    # speculative_config.kv_cache_dtype, SGLang's --kv-cache-dtype and
    # --speculative-draft-kv-cache-dtype); None where the config sets none
    kv_cache_dtype: str | None = None
    draft_kv_cache_dtype: str | None = None
    # where each value was written, `FILE: key`: "engine", "target", "drafter", "k",
    # "drafting" and each sampling setting by name (draft_* for the drafter side)
    places: dict[str, str] = field(default_factory=dict)

    @property
    def temperature(self) -> float | None:
        return self.sampling.get("temperature")

    @property
    def draft_temperature(self) -> float | None:
        """The drafter's temperature: its own when set, else the shared one (engines share SamplingParams)."""
        return self.draft_sampling.get("temperature", self.sampling.get("temperature"))

    def where(self, what: str) -> str:
        return self.places.get(what) or self.source.name

    def is_default(self, what: str) -> bool:
        """Whether the value is the engine's own default, not written in the file."""
        return self.where(what).startswith(_LLAMA_DEFAULT_AT)

    @property
    def drafter_spec(self) -> str | None:
        """The drafter as specprobe names it: a head gets its kind's prefix; the target's
        own MTP layers are 'mtp'; None where the engine drafts without a model."""
        if self.drafter_kind == "mtp":
            return "mtp"
        if self.drafter_kind is None and self.method:
            return _ngram_spec(self)
        pattern = _SPEC_OF_KIND.get(self.drafter_kind or "")
        spec = pattern.format(self.drafter) if pattern and self.drafter else None
        if spec and self.engine == LLAMA_CPP and self.drafter_kind == "independent":
            ngram = _llama_ngram_list(self)  # n-gram types beside the draft model: tried first (models.ngram_mix)
            if ngram:
                return f"{ngram}+{spec}"
        return spec


# llama-server's n-gram knobs (--spec-ngram-<type>-<knob>) as the drafter spec's knob names
_LLAMA_NGRAM_KNOBS = {
    "ngram-simple": ("size_n", "size_m", "min_hits"),
    "ngram-map-k": ("size_n", "size_m", "min_hits"),
    "ngram-map-k4v": ("size_n", "size_m", "min_hits"),
    "ngram-mod": ("n_match", "n_min", "n_max"),
    "ngram-cache": (),
}


def _ngram_spec(sv: ServingConfig) -> str | None:
    """The n-gram drafter an engine's config runs, as specprobe's drafter spec
    (specprobe.models.ngram): vLLM's prompt lookup with its prompt_lookup_min/max and K,
    llama-server's ngram-* types with their --spec-ngram-* knobs, vLLM's suffix decoding
    with its suffix_decoding_* knobs; SGLang's NGRAM with its speculative_ngram_* knobs and
    speculative_num_draft_tokens (its tree's size)."""
    if sv.engine == VLLM and sv.method in ("ngram", "ngram_gpu"):
        knobs = [f"{name}={int(sv.extra[key])}" for name, key in (("min", "prompt_lookup_min"), ("max", "prompt_lookup_max")) if sv.extra.get(key) is not None]
        if sv.num_speculative_tokens is not None:
            knobs.append(f"k={sv.num_speculative_tokens}")
        return "ngram" + (":" + ",".join(knobs) if knobs else "")
    if sv.engine == SGLANG and str(sv.method).upper() == "NGRAM":  # its speculative_ngram_* knobs and the tree's size
        knobs = [f"{key}={sv.extra[f'speculative_ngram_{key}']}" for key in _SGLANG_NGRAM_KNOBS if sv.extra.get(f"speculative_ngram_{key}") is not None]
        if sv.extra.get("speculative_num_draft_tokens") is not None:
            knobs.append(f"num_draft_tokens={int(sv.extra['speculative_num_draft_tokens'])}")
        return "sglang-ngram" + (":" + ",".join(knobs) if knobs else "")
    if sv.engine == VLLM and sv.method == "suffix":  # suffix decoding: its suffix_decoding_* knobs
        knobs = [f"{name}={sv.extra[f'suffix_decoding_{name}']}" for name in ("max_tree_depth", "max_cached_requests", "max_spec_factor", "min_token_prob") if sv.extra.get(f"suffix_decoding_{name}") is not None]
        if sv.num_speculative_tokens is not None:
            knobs.append(f"k={sv.num_speculative_tokens}")
        return "suffix" + (":" + ",".join(knobs) if knobs else "")
    if sv.engine == LLAMA_CPP:
        if any(t.startswith("draft") for t in str(sv.extra.get("spec_type") or "").split(",")):
            return None  # a draft model's type beside n-gram ones: the mix is named with the model (drafter_spec)
        return _llama_ngram_list(sv)
    return None


def _llama_ngram_list(sv: ServingConfig) -> str | None:
    """llama-server's ngram-* types with their --spec-ngram-* knobs, as a drafter spec."""
    types = [t for t in str(sv.extra.get("spec_type") or sv.method or "").split(",") if t in _LLAMA_NGRAM_KNOBS]
    parts = []
    for t in types:
        knobs = [f"{k}={sv.extra[f'{t}-{k}']}" for k in _LLAMA_NGRAM_KNOBS[t] if sv.extra.get(f"{t}-{k}") is not None]
        parts.append(t + (":" + ",".join(knobs) if knobs else ""))
    return ",".join(parts) or None


class _Places:
    """Where each key of one mapping was written, as `FILE: key` with the key spelled as
    the file spells it; a key it does not know is named under `prefix`."""

    def __init__(self, prefix: str, written: Mapping[str, str] | None = None) -> None:
        self.prefix = prefix
        self.written = dict(written or {})

    def __call__(self, key: str) -> str:
        return self.written.get(key) or f"{self.prefix}{key}"

    def inside(self, key: str) -> str:
        """The prefix for a mapping nested under `key`: 'serve.yaml: speculative-config.'."""
        return self(key) + "."


def _normal(data: Mapping[str, Any], prefix: str) -> tuple[dict[str, Any], _Places]:
    """Keys with - or _ (a key given under both spellings is refused), and where each was written."""
    out = normalise_keys(data, prefix.rstrip(". :") or "config")
    return out, _Places(prefix, {str(k).replace("-", "_"): f"{prefix}{k}" for k in data})


def _json_value(value: Any, where: str) -> Any:
    # command-line configs hold JSON objects as strings: '{"temperature": 0.6}'
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{where} is not valid JSON: {value[:60]!r}", "write it as a JSON object or a YAML mapping") from None
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    value = _json_value(value, where)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping, not {type(value).__name__}", "write it as a JSON object or a YAML mapping")
    return value


def _number(value: Any, where: str, integer: bool = False) -> float | int:
    """A number as a config or a command line writes it ('0.7', 4, '.nan'); the bounds are the caller's."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{where} {value!r} is not a number", "write a number")
    if isinstance(value, str):
        text = value.strip()
        try:
            x: float | int = int(text) if integer else float(text)
        except ValueError:
            try:
                x = float(text)
            except ValueError:
                unset = " (a shell variable this file does not set)" if text.startswith("$") else ""
                raise ConfigError(f"{where} {value!r} is not a number{unset}", "write a number") from None
    else:
        x = value
    if integer and isinstance(x, float) and x == x and abs(x) != float("inf"):
        if not x.is_integer():
            raise ConfigError(f"{where} {value!r} is not a whole number", "write a whole number")
        x = int(x)
    return x


def _count(name: str, value: Any, where: str) -> int | None:
    """K or a knob that counts tokens, checked with the setting's (or knob's) bounds."""
    if value is None:
        return None
    x = _number(value, where, integer=True)
    if name in _KNOBS:
        check_bounds(_KNOBS[name], x, where)
    else:
        check(name, x, where)
    return int(x)


_SIZED = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG])$")


def _context(value: Any, where: str) -> int | None:
    """A served context length: vLLM writes 32k (10³) or 32K (2¹⁰) as well; -1, 0 and
    'auto' leave it to the model's own."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("auto", "-1", "0")) or value in (-1, 0):
        return None
    m = _SIZED.match(value.strip()) if isinstance(value, str) else None
    if m:
        power = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
        value = int(float(m.group(1)) * power)
    return _count("context_length", value, where)


def _knob(name: str, value: Any, where: str) -> float:
    x = float(_number(value, where))
    check_bounds(_KNOBS[name], x, where)
    return x


def _sampling(d: Mapping[str, Any], places: _Places, prefix: str = "") -> tuple[dict[str, float], dict[str, str]]:
    """The sampling values a mapping sets (`prefix` draft_: the drafter's), each held to
    its setting's bounds — a serving config's temperature is refused in --temperature's
    words — and where each was written, by setting name."""
    out: dict[str, float] = {}
    where: dict[str, str] = {}
    for k in _TARGET_SAMPLING:
        v = d.get(prefix + k)
        if v is None:
            continue
        at = places(prefix + k)
        name = prefix + k if prefix + k in BY_NAME else k  # draft_min_p: the target's bounds
        if k == "top_k":
            n = _number(v, at, integer=True)
            x: float = 0.0 if n == -1 else float(n)  # -1: the engines' own spelling of "off"
        else:
            x = float(_number(v, at))
        out[k] = float(check(name, x, at))
        where[prefix + k] = at
    return out, where


def _drafting(value: Any, where: str) -> str | None:
    return None if value is None else str(check("draft_sampling", value, where))


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"))


# ----------------------------------------------------------------------------- the engines' mappings
def _vllm(spec: Mapping[str, Any], sp: _Places, top: Mapping[str, Any], tp: _Places, source: Path, engine_at: str) -> ServingConfig:
    method = spec.get("method")
    model = spec.get("model")
    if method is None and model is not None:
        method = "draft_model"  # vLLM infers the method from the model; a plain LM is a draft model
    places = {"engine": engine_at, "k": sp("num_speculative_tokens"), "drafting": sp("draft_sample_method")}
    k = _count("k", spec.get("num_speculative_tokens"), sp("num_speculative_tokens"))
    drafting = _drafting(spec.get("draft_sample_method"), sp("draft_sample_method"))
    sampling, at = _sampling(spec, sp)
    if top.get("override_generation_config") is not None:
        gp = tp.inside("override_generation_config")
        gen, gen_places = _normal(_mapping(top["override_generation_config"], tp("override_generation_config")), gp)
        more, more_at = _sampling(gen, gen_places)
        sampling = {**more, **sampling}  # the speculative config's own setting, where it has one
        at = {**more_at, **at}
    draft_sampling, draft_at = _sampling(spec, sp, prefix="draft_")
    used = {"method", "model", "num_speculative_tokens", "draft_sample_method", "kv_cache_dtype", *_TARGET_SAMPLING, *(f"draft_{k2}" for k2 in _TARGET_SAMPLING)}
    if "model" in top:
        places["target"] = tp("model")
    if model is not None:
        places["drafter"] = sp("model")
    places["context_length"] = tp("max_model_len")  # the server's; the speculative config's own is the drafter's
    # vLLM's --kv-cache-dtype (CacheConfig.cache_dtype) is the target's; the speculative
    # config's kv_cache_dtype the draft model's, which inherits the target's when unset
    places["kv_cache_dtype"], places["draft_kv_cache_dtype"] = tp("kv_cache_dtype"), sp("kv_cache_dtype")
    return ServingConfig(
        engine=VLLM,
        source=source,
        target=_text(top.get("model")),
        drafter=_text(model),
        method=str(method) if method else None,
        drafter_kind=_VLLM_KINDS.get(str(method)) if method else None,
        num_speculative_tokens=k,
        sampling=sampling,
        draft_sampling=draft_sampling,
        extra={k2: v for k2, v in spec.items() if k2 not in used},
        drafting=drafting,
        context_length=_context(top.get("max_model_len"), tp("max_model_len")),
        kv_cache_dtype=_text(top.get("kv_cache_dtype")),
        draft_kv_cache_dtype=_text(spec.get("kv_cache_dtype")),
        places={**places, **at, **draft_at},
    )


# vLLM's serve arguments that fill its speculative config (the shorthands and the older flags)
_VLLM_SPEC_ARGS = {
    "spec_method": "method",
    "spec_model": "model",
    "spec_tokens": "num_speculative_tokens",
    "speculative_model": "model",
    "num_speculative_tokens": "num_speculative_tokens",
    "speculative_draft_tensor_parallel_size": "draft_tensor_parallel_size",
    "speculative_max_model_len": "max_model_len",
    "speculative_disable_by_batch_size": "disable_by_batch_size",
}


def _vllm_serve(top: Mapping[str, Any], tp: _Places, source: Path, engine_at: str) -> ServingConfig:
    """`vllm serve`'s arguments as a mapping (its --config YAML, or its command line)."""
    spec: dict[str, Any] = {}
    sp = _Places(tp.prefix)
    if top.get("speculative_config") is not None:
        spec, sp = _normal(_mapping(top["speculative_config"], tp("speculative_config")), tp.inside("speculative_config"))
    for arg, key in _VLLM_SPEC_ARGS.items():
        if arg in top:
            spec[key] = top[arg]
            sp.written[key] = tp(arg)
    return _vllm(spec, sp, top, tp, source, engine_at)


_SGLANG_MARKS = (
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_draft_model",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_accept_threshold_single",
    "speculative_accept_threshold_acc",
    "speculative_use_rejection_sampling",
    "speculative_token_map",
    "model_path",
    "preferred_sampling_params",
)
# SGLang's NGRAM knobs (server_args' speculative_ngram_*), under the drafter spec's names
_SGLANG_NGRAM_KNOBS = ("min_match_window_size", "max_match_window_size", "min_bfs_breadth", "max_bfs_breadth", "match_type", "branch_length", "capacity")
_SGLANG_KNOBS = {
    "speculative_eagle_topk": "topk",
    "speculative_num_draft_tokens": "num_draft_tokens",
    "speculative_accept_threshold_single": "threshold_single",
    "speculative_accept_threshold_acc": "threshold_acc",
}


def _ngram_knob(key: str, value: Any, where: str) -> int | str:
    """One of NGRAM's speculative_ngram_* knobs, as SGLang's parser takes it (how the knobs
    bound one another is the drafter spec's check, `models.sglang_ngram.check`)."""
    if key == "match_type":
        if str(value).strip().upper() not in ("BFS", "PROB"):
            raise ConfigError(f"{where} {value!r} is neither BFS nor PROB", "SGLang's NGRAM matches by BFS (recency) or PROB (frequency)")
        return str(value).strip().upper()
    x = int(_number(value, where, integer=True))
    low = 2 if key == "branch_length" else 1
    if x < low:
        raise ConfigError(f"{where} {x} is below {low}", f"SGLang's NGRAM takes {key} of at least {low}")
    return x


def _sglang(d: Mapping[str, Any], dp: _Places, source: Path, engine_at: str) -> ServingConfig:
    algo = d.get("speculative_algorithm")
    places: dict[str, str] = {}
    drafter_key = "speculative_draft_model_path" if "speculative_draft_model_path" in d else "speculative_draft_model"
    target_key = "model_path" if "model_path" in d else "model"
    extra: dict[str, Any] = {}
    for key, knob in _SGLANG_KNOBS.items():
        if d.get(key) is not None:
            extra[key] = _count(knob, d[key], dp(key)) if knob in ("topk", "num_draft_tokens") else _knob(knob, d[key], dp(key))
    for key in ("speculative_token_map", "speculative_draft_model_revision", "speculative_dflash_block_size", "speculative_adaptive"):
        if key in d:
            extra[key] = d[key]
    for key in _SGLANG_NGRAM_KNOBS:  # NGRAM's knobs, read as its drafter spec's (models.sglang_ngram)
        name = f"speculative_ngram_{key}"
        if d.get(name) is not None:
            extra[name] = _ngram_knob(key, d[name], dp(name))
            places[name] = dp(name)
    # rejection sampling needs the drafter's probabilities: the drafts are sampled from q
    rejection = _truthy(d.get("speculative_use_rejection_sampling"))
    if rejection:
        extra["speculative_use_rejection_sampling"] = True
    sampling: dict[str, float] = {}
    at: dict[str, str] = {}
    if d.get("preferred_sampling_params") is not None:
        prefs, pp = _normal(_mapping(d["preferred_sampling_params"], dp("preferred_sampling_params")), dp.inside("preferred_sampling_params"))
        sampling, at = _sampling(prefs, pp)
    places = {**places, "engine": engine_at, "k": dp("speculative_num_steps"), "drafting": dp("speculative_use_rejection_sampling"), **{key: dp(key) for key in _SGLANG_KNOBS}, **at}
    if d.get(target_key) is not None:
        places["target"] = dp(target_key)
    if d.get(drafter_key) is not None:
        places["drafter"] = dp(drafter_key)
    return ServingConfig(
        engine=SGLANG,
        source=source,
        target=_text(d.get(target_key)),
        drafter=_text(d.get(drafter_key)),
        method=str(algo) if algo else None,
        drafter_kind=_SGLANG_KINDS.get(str(algo).upper()) if algo else None,
        # SGLang's chain depth is num_steps; num_draft_tokens counts the whole tree
        num_speculative_tokens=_count("k", d.get("speculative_num_steps"), dp("speculative_num_steps")),
        sampling=sampling,
        extra=extra,
        drafting=PROBABILISTIC if rejection else None,
        context_length=_context(d.get("context_length"), dp("context_length")),
        kv_cache_dtype=_text(d.get("kv_cache_dtype")),
        draft_kv_cache_dtype=_text(d.get("speculative_draft_kv_cache_dtype")),  # unset: --kv-cache-dtype's
        places={**places, "context_length": dp("context_length"), "kv_cache_dtype": dp("kv_cache_dtype"), "draft_kv_cache_dtype": dp("speculative_draft_kv_cache_dtype")},
    )


def _trtllm(spec: Mapping[str, Any], sp: _Places, top: Mapping[str, Any], tp: _Places, source: Path) -> ServingConfig:
    decoding = str(spec.get("decoding_type") or "")
    kind = _TRTLLM_KINDS.get(decoding.lower())
    # Medusa's max_draft_len counts the tree's tokens; its chain is one token per head
    k_key = "num_medusa_heads" if kind == "medusa" and "num_medusa_heads" in spec else "max_draft_len"
    if kind == "mtp" and spec.get("max_draft_len") is None and "num_nextn_predict_layers" in spec:
        k_key = "num_nextn_predict_layers"
    drafter_key = "speculative_model" if "speculative_model" in spec else "speculative_model_dir"
    kv_cfg = _mapping(top["kv_cache_config"], tp("kv_cache_config")) if top.get("kv_cache_config") is not None else {}
    extra = {k2: v for k2, v in spec.items() if k2 not in ("decoding_type", k_key, drafter_key)}
    if spec.get("max_total_draft_tokens") is not None:
        extra["max_total_draft_tokens"] = _count("draft_tokens", spec["max_total_draft_tokens"], sp("max_total_draft_tokens"))
    if k_key != "max_draft_len" and spec.get("max_draft_len") is not None:
        extra["max_draft_len"] = _count("draft_tokens", spec["max_draft_len"], sp("max_draft_len"))
    places = {"engine": sp("decoding_type"), "k": sp(k_key)}
    if top.get("model") is not None:
        places["target"] = tp("model")
    if spec.get(drafter_key) is not None:
        places["drafter"] = sp(drafter_key)
    return ServingConfig(
        engine=TRTLLM,
        source=source,
        target=_text(top.get("model")),
        drafter=_text(spec.get(drafter_key)),
        method=decoding or None,
        drafter_kind=kind,
        num_speculative_tokens=_count("k", spec.get(k_key), sp(k_key)),
        extra=extra,
        context_length=_context(top.get("max_seq_len"), tp("max_seq_len")),
        # kv_cache_config.dtype (llmapi KvCacheConfig: "auto" | "fp8" …), the one cache of
        # target and draft alike
        kv_cache_dtype=_text(kv_cfg.get("dtype")),
        places={**places, "context_length": tp("max_seq_len"), **({"kv_cache_dtype": tp.inside("kv_cache_config") + "dtype"} if kv_cfg.get("dtype") is not None else {})},
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


# KV-cache dtypes as the engines spell them, as --kv-cache-dtype takes them: vLLM's
# CacheDType (vllm/config/cache.py; its "fp8" is e4m3 on CUDA) and SGLang's
# --kv-cache-dtype choices (python/sglang/srt/server_args.py). The 16-bit caches hold
# what a bf16/fp16 run computes: auto. e5m2, int8, the FP4 caches and the MLA-specific
# fp8 are not simulated.
_KV_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "bfloat16": "auto", "bf16": "auto", "float16": "auto", "half": "auto"}
# llama.cpp's (read from -ctk/-ctv as "K/V"): ggml's own types, simulated as ggml stores
# them (llama.cpp computes in f32 on the CPU, so its f16 and bf16 caches round too); iq4_nl
# is not simulated


def kv_cache_setting(value: str, where: str, engine: str | None = None) -> str:
    """An engine's KV-cache dtype as specprobe's --kv-cache-dtype (auto | fp8 | ggml types
    for llama.cpp), or a one-line refusal naming where it was written."""
    if engine == LLAMA_CPP:
        from specprobe.settings.model import parse_kv_cache_dtype

        try:
            return parse_kv_cache_dtype(value, where)
        except ConfigError:
            raise ConfigError(
                f"{where} {value!r} is a KV-cache type specprobe does not simulate (it simulates llama.cpp's f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1)",
                "pass --kv-cache-dtype (and --draft-kv-cache-dtype) with the nearest type it simulates, e.g. q4_0 for iq4_nl, to say which to score",
            ) from None
    found = _KV_DTYPES.get(value.strip().lower())
    if found is None:
        raise ConfigError(
            f"{where} {value!r} is a KV-cache dtype specprobe does not simulate (it simulates fp8 e4m3: fp8, fp8_e4m3; and 16-bit caches: auto, bfloat16)",
            "pass --kv-cache-dtype (and --draft-kv-cache-dtype) auto or fp8 to say which to score",
        )
    return found


# ----------------------------------------------------------------------------- files that are mappings
_VLLM_SERVE_MARKS = ("speculative_config", *_VLLM_SPEC_ARGS)


def _from_mapping(data: Mapping[str, Any], path: Path, source: Path | None = None) -> ServingConfig:
    src = source or path
    d, dp = _normal(data, f"{path.name}: ")
    spec = d.get("speculative_config")
    inner = _mapping(spec, dp("speculative_config")) if spec is not None else None
    if inner is not None and any(str(k).replace("-", "_") in ("decoding_type", "max_draft_len") for k in inner):
        s, sp = _normal(inner, dp.inside("speculative_config"))
        return _trtllm(s, sp, d, dp, src)
    if "decoding_type" in d:
        return _trtllm(d, dp, {}, dp, src)
    if "speculative_config" in d:
        return _vllm_serve(d, dp, src, dp("speculative_config"))
    if any(k in d for k in _SGLANG_MARKS):
        return _sglang(d, dp, src, dp(next(k for k in _SGLANG_MARKS if k in d)))
    if any(k in d for k in ("speculative_model", "spec_method", "spec_model", "spec_tokens")):
        return _vllm_serve(d, dp, src, dp(next(k for k in _VLLM_SERVE_MARKS if k in d)))
    if any(k.startswith("speculative_") for k in d):
        return _sglang(d, dp, src, dp(next(k for k in d if k.startswith("speculative_"))))
    if any(k in d for k in ("method", "num_speculative_tokens", "draft_sample_method")) or ("model" in d and len(d) > 1):
        return _vllm(d, dp, {}, dp, src, dp(next((k for k in ("method", "num_speculative_tokens", "model") if k in d), "model")))
    raise ConfigError(
        f"{path} is none of: a vLLM speculative config or serve YAML, an SGLang launch config, a TensorRT-LLM decoding config",
        "expected keys like method/num_speculative_tokens (vLLM), speculative-algorithm (SGLang) or speculative_config.decoding_type (TensorRT-LLM); a launch script or args file is read by its command line",
    )








def _program(words: list[str]) -> tuple[str, int, str] | None:
    """(engine, index of its first argument, the program as written) for a command that
    starts a serving engine, however it is wrapped (exec, nohup, env, numactl, python -m)."""
    for i, w in enumerate(words):
        base = w.rsplit("/", 1)[-1].lower()
        if base in ("llama-server", "llama-server.exe"):
            return LLAMA_CPP, i + 1, base
        if base == "trtllm-serve":
            return TRTLLM, i + 1, base
        if base == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
            return VLLM, i + 2, "vllm serve"
        if w == "-m" and i + 1 < len(words):
            module = words[i + 1]
            if module.startswith("vllm.entrypoints.openai.api_server") or module == "vllm.entrypoints.cli.main":
                return VLLM, i + 2, f"python -m {module}"
            if module.startswith("sglang.launch_server"):
                return SGLANG, i + 2, f"python -m {module}"
    return None








def _dotted(value: str) -> Any:
    # vLLM reads --json-arg.key VALUE as JSON, else as the text itself
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


_VLLM_VALUE = frozenset({"--model", "--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens", "--speculative-model", "--num-speculative-tokens", "--override-generation-config", "--generation-config", "--config"})


def _vllm_args(args: list[str], name: str, prog: str, base: dict[str, Any], bp: _Places, source: Path) -> ServingConfig:
    top, tp = dict(base), _Places(bp.prefix, bp.written)
    flags, positional = split_flags(args, _VLLM_VALUE, frozenset())
    if positional:
        top["model"], tp.written["model"] = positional[0], f"{name}: {prog} MODEL"
    dotted: dict[str, Any] = {}
    dotted_as = ""
    for flag, value, written in flags:
        if flag in ("--speculative-config", "-sc"):
            top["speculative_config"], tp.written["speculative_config"] = value, f"{name}: {written}"
        elif flag.startswith(("--speculative-config.", "-sc.")):
            head, *path = written.split(".")
            if path:
                dotted[path[0]] = _dotted(value) if len(path) == 1 else {".".join(path[1:]): _dotted(value)}
                dotted_as = dotted_as or head
        elif flag.startswith("--") and flag != "--config":
            key = flag[2:].replace("-", "_")
            top[key], tp.written[key] = value, f"{name}: {written}"
    if dotted:
        # vLLM turns the dotted keys into one --speculative-config JSON after the others: it replaces them
        top["speculative_config"], tp.written["speculative_config"] = dotted, f"{name}: {dotted_as}"
    return _vllm_serve(top, tp, source, f"{name}: {prog}" if prog else tp("speculative_config"))


_SGLANG_ALIASES = {"model": "model_path", "speculative_draft_model": "speculative_draft_model_path"}
_SGLANG_VALUE = frozenset({"--model-path", "--model", "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model", "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-accept-threshold-single", "--speculative-accept-threshold-acc", "--speculative-token-map", "--preferred-sampling-params", "--config", *(f"--speculative-ngram-{k.replace('_', '-')}" for k in _SGLANG_NGRAM_KNOBS)})
_SGLANG_BOOL = frozenset({"--speculative-use-rejection-sampling", "--trust-remote-code", "--enable-metrics", "--speculative-adaptive"})


def _sglang_args(args: list[str], name: str, prog: str, base: dict[str, Any], bp: _Places, source: Path) -> ServingConfig:
    d, dp = dict(base), _Places(bp.prefix, bp.written)
    flags, _ = split_flags(args, _SGLANG_VALUE, _SGLANG_BOOL)
    for flag, value, written in flags:
        if flag.startswith("--") and flag != "--config":
            key = flag[2:].replace("-", "_")
            key = _SGLANG_ALIASES.get(key, key)
            d[key], dp.written[key] = value, f"{name}: {written}"
    return _sglang(d, dp, source, f"{name}: {prog}")


# llama-server's spellings (common/arg.cpp) of what specprobe reads, old and new
_LLAMA_FLAGS = {
    "-m": "model", "--model": "model",
    "-md": "model_draft", "--model-draft": "model_draft", "--spec-draft-model": "model_draft",
    "-hf": "hf_repo", "-hfr": "hf_repo", "--hf-repo": "hf_repo",
    "-hfd": "hf_repo_draft", "-hfrd": "hf_repo_draft", "--hf-repo-draft": "hf_repo_draft", "--spec-draft-hf": "hf_repo_draft",
    "--spec-type": "spec_type", "--spec-default": "spec_default",
    "--spec-draft-n-max": "n_max", "--draft-max": "n_max", "--draft": "n_max", "--draft-n": "n_max",
    "--spec-draft-n-min": "n_min", "--draft-min": "n_min", "--draft-n-min": "n_min",
    "--spec-draft-p-min": "p_min", "--draft-p-min": "p_min",
    "--spec-draft-p-split": "p_split", "--draft-p-split": "p_split",
    "--temp": "temperature", "--temperature": "temperature",
    "--top-k": "top_k", "--top-p": "top_p", "--min-p": "min_p",
    "-c": "ctx_size", "--ctx-size": "ctx_size",
    "-ctk": "cache_type_k", "--cache-type-k": "cache_type_k", "-ctv": "cache_type_v", "--cache-type-v": "cache_type_v",
    "-ctkd": "cache_type_k_draft", "--cache-type-k-draft": "cache_type_k_draft", "--spec-draft-type-k": "cache_type_k_draft",
    "-ctvd": "cache_type_v_draft", "--cache-type-v-draft": "cache_type_v_draft", "--spec-draft-type-v": "cache_type_v_draft",
    "-fa": "flash_attn", "--flash-attn": "flash_attn",
    **{f"--spec-{t}-{k.replace('_', '-')}": f"{t}-{k}" for t, ks in _LLAMA_NGRAM_KNOBS.items() for k in ks},
}  # fmt: skip
_LLAMA_ENV = {
    "LLAMA_ARG_MODEL": "model",
    "LLAMA_ARG_SPEC_DRAFT_MODEL": "model_draft", "LLAMA_ARG_MODEL_DRAFT": "model_draft",
    "LLAMA_ARG_HF_REPO": "hf_repo", "LLAMA_ARG_SPEC_DRAFT_HF_REPO": "hf_repo_draft",
    "LLAMA_ARG_SPEC_TYPE": "spec_type",
    "LLAMA_ARG_SPEC_DRAFT_N_MAX": "n_max", "LLAMA_ARG_DRAFT_MAX": "n_max",
    "LLAMA_ARG_SPEC_DRAFT_N_MIN": "n_min", "LLAMA_ARG_DRAFT_MIN": "n_min",
    "LLAMA_ARG_SPEC_DRAFT_P_MIN": "p_min", "LLAMA_ARG_DRAFT_P_MIN": "p_min",
    "LLAMA_ARG_SPEC_DRAFT_P_SPLIT": "p_split", "LLAMA_ARG_DRAFT_P_SPLIT": "p_split",
    "LLAMA_ARG_TEMPERATURE": "temperature", "LLAMA_ARG_TOP_K": "top_k", "LLAMA_ARG_TOP_P": "top_p", "LLAMA_ARG_MIN_P": "min_p",
    "LLAMA_ARG_CTX_SIZE": "ctx_size",
    "LLAMA_ARG_CACHE_TYPE_K": "cache_type_k", "LLAMA_ARG_CACHE_TYPE_V": "cache_type_v",
    "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K": "cache_type_k_draft", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V": "cache_type_v_draft",
    "LLAMA_ARG_FLASH_ATTN": "flash_attn",
}  # fmt: skip
# -fa takes on|off|auto here; older builds took it bare, so it takes the next word only when that is no flag
_LLAMA_VALUE = frozenset(k for k, v in _LLAMA_FLAGS.items() if v not in ("spec_default", "flash_attn"))
# llama-server's --cache-type-k/-v values (common/arg.cpp kv_cache_types), its default f16
# for both, target and draft model apart (the draft's do not follow the target's)
LLAMA_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_LLAMA_FLOAT_KV = ("f32", "f16", "bf16")
LLAMA_KV_DEFAULT = "f16"

# What llama-server runs with where its command line and environment set nothing
# (common/common.h: common_params_sampling, common_params_speculative_draft; llama.cpp as
# vendored by llama-cpp-python 0.3.36, the build the project's engine tests run). A
# request's own sampling fields replace the sampler's for that request.
LLAMA_SERVER_DEFAULTS: dict[str, float] = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
LLAMA_SERVER_N_MAX = 3
_LLAMA_DEFAULT_AT = "llama-server's default"


def _llamacpp(args: list[str], env: Mapping[str, tuple[str, str]], name: str, prog: str, source: Path) -> ServingConfig:
    """llama-server's settings: its environment first, then its flags over it."""
    vals: dict[str, Any] = {}
    at: dict[str, str] = {}
    for var, (value, where) in env.items():
        if var in _LLAMA_ENV:
            vals[_LLAMA_ENV[var]], at[_LLAMA_ENV[var]] = value, where
    flags, _ = split_flags(args, _LLAMA_VALUE, frozenset({"--spec-default"}))
    for flag, value, written in flags:
        if flag in _LLAMA_FLAGS:  # llama-server keeps the last of a flag given twice
            vals[_LLAMA_FLAGS[flag]], at[_LLAMA_FLAGS[flag]] = value, f"{name}: {written}"
    places = _Places(f"{name}: ", at)
    types = [t.strip() for t in str(vals.get("spec_type") or "").split(",") if t.strip()]
    if _truthy(vals.get("spec_default")) and not types:
        types = ["ngram-mod"]  # --spec-default: llama-server's default speculation
    drafted = [t for t in types if t.startswith("draft")]
    drafter = vals.get("model_draft") or _repo(vals.get("hf_repo_draft"))
    method = drafted[0] if drafted else (types[0] if types else ("draft-simple" if drafter else None))
    kind = _LLAMA_KINDS.get(method or "")
    extra: dict[str, Any] = {"spec_type": ",".join(types)} if types else {}
    for knob in ("p_min", "p_split"):
        if vals.get(knob) is not None:
            extra[knob] = _knob(knob, vals[knob], places(knob))
    if vals.get("n_min") is not None:
        extra["n_min"] = _count("n_min", vals["n_min"], places("n_min"))
    for key in (k2 for k2 in vals if k2.startswith("ngram-")):  # --spec-ngram-<type>-<knob>
        x = int(_number(vals[key], places(key), integer=True))
        low = 0 if key.endswith(("n_min", "n_max")) else 1  # common/arg.cpp's bounds
        if x < low or (not key.endswith("min_hits") and x > 1024):
            raise ConfigError(f"{places(key)} {x} is out of range", f"llama-server takes {low} to 1024" if not key.endswith("min_hits") else "llama-server takes at least 1")
        extra[key] = x
    k = _count("k", vals.get("n_max"), places("n_max"))
    if k is None and (method or "").startswith("draft"):  # the draft types share one n_max
        k, places.written["n_max"] = LLAMA_SERVER_N_MAX, f"{_LLAMA_DEFAULT_AT} --spec-draft-n-max {LLAMA_SERVER_N_MAX}"
    if k is not None:
        extra["n_max"] = k
    if k is not None and extra.get("n_min") is not None and extra["n_min"] > k:
        raise ConfigError(f"{places('n_min')} {extra['n_min']} is more than {places('n_max')} {k}", "the fewest draft tokens cannot exceed the most")
    for key, default in LLAMA_SERVER_DEFAULTS.items():
        if vals.get(key) is None:  # the server's sampler, unless the requests say otherwise
            vals[key], places.written[key] = default, f"{_LLAMA_DEFAULT_AT} {key} {default:g} (a request's own value replaces it)"
    sampling, s_at = _sampling(vals, places)
    target = vals.get("model") or _repo(vals.get("hf_repo"))
    cfg_places = {"engine": f"{name}: {prog}" if prog else next(iter(at.values()), name), "k": places("n_max"), "p_min": places("p_min"), "n_min": places("n_min"), **s_at}
    if target:
        cfg_places["target"] = places("model" if vals.get("model") else "hf_repo")
    if drafter:
        cfg_places["drafter"] = places("model_draft" if vals.get("model_draft") else "hf_repo_draft")
    kv, kv_at = _llama_kv(vals, places, "")
    draft_kv, draft_kv_at = _llama_kv(vals, places, "_draft") if drafter else (None, None)
    if kv is not None and draft_kv is None and drafter:
        # the draft model's cache keeps llama-server's f16 unless -ctkd/-ctvd say otherwise
        draft_kv, draft_kv_at = LLAMA_KV_DEFAULT, f"{_LLAMA_DEFAULT_AT} --cache-type-k-draft/-v-draft {LLAMA_KV_DEFAULT} (the draft model's cache does not follow -ctk/-ctv)"
    kv_places = {k2: v2 for k2, v2 in (("kv_cache_dtype", kv_at), ("draft_kv_cache_dtype", draft_kv_at)) if v2}
    return ServingConfig(
        engine=LLAMA_CPP,
        source=source,
        target=_text(target),
        drafter=_text(drafter),
        method=method,
        drafter_kind=kind,
        num_speculative_tokens=k,
        sampling=sampling,
        extra=extra,
        context_length=_context(vals.get("ctx_size"), places("ctx_size")),  # 0: the model's own
        kv_cache_dtype=kv,
        draft_kv_cache_dtype=draft_kv,
        places={**cfg_places, "context_length": places("ctx_size"), **kv_places},
    )


def _llama_kv(vals: Mapping[str, Any], places: _Places, side: str) -> tuple[str | None, str | None]:
    """One model's KV-cache types from llama-server's --cache-type-k/-v (side "") or the
    draft model's --cache-type-k-draft/-v-draft (side "_draft"), as `K/V` ("q8_0" when
    both are the same) and where they were written; (None, None) when neither is set.
    A quantized V cache needs flash attention (llama.cpp's context refuses it with -fa off;
    -fa auto turns it on)."""
    found: dict[str, str] = {}
    for part in ("k", "v"):
        key = f"cache_type_{part}{side}"
        if vals.get(key) is None:
            continue
        t = str(vals[key]).strip()
        if t not in LLAMA_KV_TYPES:  # llama-server compares with ggml's type names as they are
            raise ConfigError(f"{places(key)} {t!r} is not a KV-cache type llama-server takes", f"it takes {', '.join(LLAMA_KV_TYPES)}")
        found[part] = t
    if not found:
        return None, None
    k_type, v_type = found.get("k", LLAMA_KV_DEFAULT), found.get("v", LLAMA_KV_DEFAULT)
    fa = vals.get("flash_attn")
    if v_type not in _LLAMA_FLOAT_KV and isinstance(fa, str) and fa.strip() in ("off", "disabled", "false", "0"):
        raise ConfigError(
            f"{places(f'cache_type_v{side}')} {v_type} is a quantized V cache, which llama-server refuses with {places('flash_attn')} {fa} (quantized V cache requires flash_attn)",
            "drop -fa off (auto turns flash attention on for it), or keep the V cache at f16",
        )
    at = ", ".join(places(f"cache_type_{p}{side}") for p in ("k", "v") if p in found)
    if len(found) == 1:
        other = "v" if "k" in found else "k"
        at += f" ({_LLAMA_DEFAULT_AT} --cache-type-{other}{'-draft' if side else ''} {LLAMA_KV_DEFAULT})"
    return (k_type if k_type == v_type else f"{k_type}/{v_type}"), at


def _repo(value: Any) -> str | None:
    """A -hf repo without its :quant tag."""
    return str(value).split(":", 1)[0] if value else None


_TRTLLM_CONFIG = ("--extra-llm-api-options", "--config")


def _trtllm_args(args: list[str], name: str, prog: str, source: Path) -> ServingConfig:
    flags, positional = split_flags(args, frozenset(_TRTLLM_CONFIG), frozenset())
    named = next(((v, w) for f, v, w in flags if f in _TRTLLM_CONFIG and isinstance(v, str)), None)
    if named is None:
        raise ConfigError(f"{name} runs trtllm-serve without --extra_llm_api_options", "its speculative_config is in that YAML: pass it with --extra_llm_api_options, or pass the YAML as the serving config")
    yaml_path = _beside(source, named[0])
    cfg = _from_mapping(read_mapping(yaml_path), yaml_path, source)
    if cfg.engine != TRTLLM:
        raise ConfigError(f"{name}: {named[1]} {yaml_path.name} holds no speculative_config with a decoding_type", "write speculative_config: {decoding_type: …, max_draft_len: …} in it")
    seq = next(((v, w) for f, v, w in flags if f == "--max-seq-len"), None)
    if seq is not None:  # trtllm-serve's flag over its YAML's
        cfg = _replace(cfg, context_length=_context(seq[0], f"{name}: {seq[1]}"), places={**cfg.places, "context_length": f"{name}: {seq[1]}"})
    if positional and cfg.target is None:
        return _replace(cfg, target=positional[0], places={**cfg.places, "target": f"{name}: {prog} MODEL"})
    return cfg


def _beside(script: Path, named: str) -> Path:
    """A file a launch script names, relative to the script's folder."""
    p = Path(named).expanduser()
    p = p if p.is_absolute() else script.parent / p
    if not p.is_file():
        raise ConfigError(f"{script.name} names {named}, which does not exist (read relative to {script.parent})", "give the path as the script runs it, or pass that file as the serving config")
    return p


def _replace(cfg: ServingConfig, **changes: Any) -> ServingConfig:
    return ServingConfig(**{**cfg.__dict__, **changes})


def _engine_config(args: list[str], name: str, source: Path) -> tuple[dict[str, Any], _Places]:
    """The --config YAML a vLLM or SGLang command line names: its flags go over it, as the engines do."""
    flags, _ = split_flags(args, frozenset({"--config"}), frozenset())
    named = next((v for f, v, _w in flags if f == "--config" and isinstance(v, str)), None)
    if named is None:
        return {}, _Places(f"{name}: ")
    path = _beside(source, named)
    return _normal(read_mapping(path), f"{path.name}: ")


# flags that say which engine an args file (no program named) is for
_ARGS_MARKS = {
    LLAMA_CPP: frozenset(_LLAMA_FLAGS),
    VLLM: frozenset({"--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens", "--speculative-model", "--num-speculative-tokens", "--override-generation-config"}),
    SGLANG: frozenset(f for f in _SGLANG_VALUE | _SGLANG_BOOL if f.startswith("--speculative") or f in ("--model-path", "--preferred-sampling-params")),
}


def _from_command_lines(path: Path) -> ServingConfig:
    """A launch script (or an args file, or an env file of LLAMA_ARG_* lines): the one
    engine command in it, with the environment the script gives that command."""
    text = read_text(path, "serving config")
    name = path.name
    variables: dict[str, str] = {}
    exported: dict[str, tuple[str, str]] = {}  # NAME → (value, where it was set)
    assigned: dict[str, tuple[str, str]] = {}  # plain NAME=value lines (an env file's)
    auto_export = False
    found: list[tuple[Command, list[str], tuple[str, int, str], dict[str, tuple[str, str]]]] = []
    loose: list[str] = []
    for cmd in commands(text, variables):
        words = cmd.words
        j = 0
        prefix: dict[str, tuple[str, str]] = {}
        while j < len(words) and (m := ASSIGN.match(words[j])):
            prefix[m.group(1)] = (m.group(2), f"{name}: {m.group(1)}")
            j += 1
        rest = words[j:]
        if not rest:
            for var, (value, where) in prefix.items():
                variables[var] = value
                (exported if auto_export else assigned)[var] = (value, where)
            continue
        if rest[0] == "export" or (rest[0] in ("declare", "typeset") and "-x" in rest[1:]):
            for w in rest[1:]:
                m = ASSIGN.match(w)
                if m:
                    variables[m.group(1)] = m.group(2)
                    exported[m.group(1)] = (m.group(2), f"{name}: {m.group(1)}")
                elif NAME.fullmatch(w) and w in variables:
                    exported[w] = (variables[w], assigned.get(w, ("", f"{name}: {w}"))[1])
            continue
        if rest[0] == "set" and any(w.startswith("-") and "a" in w for w in rest[1:]):
            auto_export = True
            continue
        started = _program(rest)
        if started is not None:
            # env A=1 llama-server …, numactl … llama-server: assignments before the program are its environment
            env = {**prefix, **{m.group(1): (m.group(2), f"{name}: {m.group(1)}") for w in rest[: started[1]] if (m := ASSIGN.match(w))}}
            found.append((cmd, rest, started, env))
        elif is_flag(rest[0]):
            loose.extend(rest)
    if len(found) > 1:
        lines = ", ".join(str(c.line) for c, _, _, _ in found)
        raise ConfigError(f"{name} starts {len(found)} serving engines (lines {lines})", "pass a file that starts one, or one command line per serving config")
    if found:
        _, rest, (engine, start, prog), env = found[0]
        args = rest[start:]
        if engine == LLAMA_CPP:
            return _llamacpp(args, {**exported, **env}, name, prog, path)
        if engine == TRTLLM:
            return _trtllm_args(args, name, prog, path)
        base, bp = _engine_config(args, name, path)
        return _vllm_args(args, name, prog, base, bp, path) if engine == VLLM else _sglang_args(args, name, prog, base, bp, path)
    return _args_file(loose, {**assigned, **exported}, name, path)


def _args_file(words: list[str], env: Mapping[str, tuple[str, str]], name: str, path: Path) -> ServingConfig:
    flags, _ = split_flags(words, frozenset(), frozenset())
    given = {f.split(".", 1)[0] for f, _v, _w in flags}
    engines = [e for e, marks in _ARGS_MARKS.items() if given & marks]
    if not engines and any(var in _LLAMA_ENV for var in env):
        engines = [LLAMA_CPP]
    if len(engines) > 1:
        raise ConfigError(f"{name} has flags of {' and '.join(get(e).label for e in engines)}", "pass one engine's arguments per serving config")
    if not engines:
        raise ConfigError(
            f"{name} starts no serving engine (vllm serve, python -m sglang.launch_server, llama-server, trtllm-serve) and holds no engine arguments",
            "pass the launch script, an args file, a vLLM/SGLang YAML or JSON, or a TensorRT-LLM YAML",
        )
    engine = engines[0]
    if engine == LLAMA_CPP:
        return _llamacpp(words, env, name, "", path)
    base, bp = _engine_config(words, name, path)
    return _vllm_args(words, name, "", base, bp, path) if engine == VLLM else _sglang_args(words, name, "", base, bp, path)


def read_serving_config(path: str | Path) -> ServingConfig:
    """Read what an engine is launched with: a JSON / YAML / TOML config (vLLM, SGLang,
    TensorRT-LLM), or a launch script, args file or env file (any other name)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"serving config {p} does not exist", "pass vLLM's --speculative-config JSON, a vllm serve / SGLang / TensorRT-LLM YAML, or the engine's launch script")
    if p.suffix.lower() in (".json", ".yaml", ".yml", ".toml"):
        return _from_mapping(read_mapping(p), p)
    return _from_command_lines(p)


def describe_serving(sv: ServingConfig) -> str:
    """One line: the engine, drafter, K, drafting and sampling a serving config sets."""
    engine = get(sv.engine).label
    method = f" ({sv.method}{', ' + sv.drafter_kind if sv.drafter_kind else ''})" if sv.method else ""
    k_name = sv.where("k").split(": ", 1)[-1]
    k = f"K = {sv.num_speculative_tokens} ({k_name})" if sv.num_speculative_tokens else "K not set"
    tree = served_tree(sv)
    if tree is not None:
        k = f"a tree: {tree}"
    drafting = f", {sv.drafting} drafting ({sv.where('drafting').split(': ', 1)[-1]})" if sv.drafting else ""
    sampling = ", ".join(f"{k2} {v:g}" for k2, v in {**sv.sampling, **{f"draft_{k3}": v3 for k3, v3 in sv.draft_sampling.items()}}.items()) or "no sampling settings"
    return f"{sv.source.name} ({engine}): drafter {sv.drafter or 'none'}{method}, {k}{drafting}, {sampling}"


def tree_setting(sv: ServingConfig) -> tuple[str, str] | None:
    """The `--tree` value a serving config verifies, and where it was written, or None for
    a chain: SGLang's speculative-eagle-topk > 1 with its num_steps and num_draft_tokens;
    TensorRT-LLM's static `eagle_choices` / `medusa_choices` (rank paths), or its
    `use_dynamic_tree` with `dynamic_tree_max_topK`, `max_draft_len` (depth) and
    `max_total_draft_tokens` (nodes, the root not counted)."""
    from specprobe.settings.values import parse_tree

    if sv.engine == SGLANG:
        if str(sv.method).upper() == "NGRAM":  # its tree is the drafter's own (sglang-ngram), not a --tree shape
            return None
        topk, tokens, steps = sv.extra.get("speculative_eagle_topk"), sv.extra.get("speculative_num_draft_tokens"), sv.num_speculative_tokens
        if topk is None or int(topk) <= 1 or tokens is None or steps is None:
            return None
        where = sv.where("speculative_eagle_topk")
        return parse_tree(f"steps={steps},topk={topk},tokens={tokens}", where), where
    if sv.engine != TRTLLM:
        return None
    for key in ("eagle_choices", "medusa_choices"):
        choices = sv.extra.get(key)
        if choices:
            text = choices if isinstance(choices, str) else json.dumps(choices)
            return parse_tree(text, f"{sv.source.name}: {key}"), f"{sv.source.name}: {key}"
    if _truthy(sv.extra.get("use_dynamic_tree")) and sv.extra.get("dynamic_tree_max_topK") and sv.num_speculative_tokens:
        total = sv.extra.get("max_total_draft_tokens")
        if total is None:
            return None
        where = f"{sv.source.name}: use_dynamic_tree"
        return parse_tree(f"steps={sv.num_speculative_tokens},topk={int(sv.extra['dynamic_tree_max_topK'])},tokens={int(total) + 1}", where), where
    return None


def served_tree(sv: ServingConfig) -> str | None:
    """The draft tree a serving config verifies, in words, or None for a chain: SGLang's
    EAGLE/STANDALONE with speculative-eagle-topk > 1 drafts topk candidates per step, num_steps
    deep, and verifies num_draft_tokens of them in one pass (topk 1 and num_draft_tokens
    num_steps + 1 is the chain). specprobe's estimates are a chain's."""
    if sv.engine == TRTLLM:
        tree = tree_setting(sv)
        return None if tree is None else f"{tree[0]} ({tree[1].split(': ', 1)[-1]}); diagnose estimates this tree"
    if sv.engine != SGLANG or str(sv.method).upper() == "NGRAM":  # NGRAM: the drafter spec carries its tree
        return None
    topk = sv.extra.get("speculative_eagle_topk")
    tokens = sv.extra.get("speculative_num_draft_tokens")
    steps = sv.num_speculative_tokens
    if topk is None or int(topk) <= 1:
        return None
    where = {key: sv.where(key).split(": ", 1)[-1] for key in ("k", "speculative_eagle_topk", "speculative_num_draft_tokens")}
    parts = [f"depth {steps} ({where['k']})" if steps else "depth not set", f"{topk} candidates per step ({where['speculative_eagle_topk']})"]
    if tokens is not None:
        parts.append(f"{tokens} tokens verified ({where['speculative_num_draft_tokens']})")
    if tokens is None or not steps:
        return ", ".join(parts) + "; set the missing knob to estimate this tree (specprobe estimates the chain of its top candidates meanwhile)"
    return ", ".join(parts) + f"; diagnose estimates this tree (--tree steps={steps},topk={topk},tokens={tokens})"

