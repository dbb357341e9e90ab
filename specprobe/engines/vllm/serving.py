"""vLLM's serving configs (vllm/config/speculative.py, vllm/engine/arg_utils.py,
vllm/utils/argparse_utils.py): the `--speculative-config` JSON {"method", "model",
"num_speculative_tokens", "draft_sample_method": "greedy" | "probabilistic", …}; a `vllm
serve --config` YAML (`model:`, `speculative-config:` as a mapping or as that JSON string,
`override-generation-config:`, the shorthands `spec-method/-model/-tokens:` and the older
`speculative-model:` / `num-speculative-tokens:`); a command line — `vllm serve MODEL` or
`python -m vllm.entrypoints.openai.api_server --model MODEL` with `--speculative-config
'{…}'`, `-sc`, `--speculative-config={…}`, the dotted `--speculative-config.num_speculative_tokens 3`,
`--spec-method/--spec-model/--spec-tokens`, `--speculative-model/--num-speculative-tokens`,
`--override-generation-config`, `--config`. The reader's surface is `settings.served`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specprobe.engines.vllm import ENGINE
from specprobe.settings import served
from specprobe.settings.shell import split_flags

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


def _vllm(spec: Mapping[str, Any], sp: served.Places, top: Mapping[str, Any], tp: served.Places, source: Path, engine_at: str) -> served.ServingConfig:
    method = spec.get("method")
    model = spec.get("model")
    if method is None and model is not None:
        method = "draft_model"  # vLLM infers the method from the model; a plain LM is a draft model
    places = {"engine": engine_at, "k": sp("num_speculative_tokens"), "drafting": sp("draft_sample_method")}
    k = served.read_count("k", spec.get("num_speculative_tokens"), sp("num_speculative_tokens"))
    drafting = served.read_drafting(spec.get("draft_sample_method"), sp("draft_sample_method"))
    sampling, at = served.read_sampling(spec, sp)
    if top.get("override_generation_config") is not None:
        gp = tp.inside("override_generation_config")
        gen, gen_places = served.normalised(served.as_mapping(top["override_generation_config"], tp("override_generation_config")), gp)
        more, more_at = served.read_sampling(gen, gen_places)
        sampling = {**more, **sampling}  # the speculative config's own setting, where it has one
        at = {**more_at, **at}
    draft_sampling, draft_at = served.read_sampling(spec, sp, prefix="draft_")
    used = {"method", "model", "num_speculative_tokens", "draft_sample_method", "kv_cache_dtype", *served.TARGET_SAMPLING, *(f"draft_{k2}" for k2 in served.TARGET_SAMPLING)}
    if "model" in top:
        places["target"] = tp("model")
    if model is not None:
        places["drafter"] = sp("model")
    places["context_length"] = tp("max_model_len")  # the server's; the speculative config's own is the drafter's
    # vLLM's --kv-cache-dtype (CacheConfig.cache_dtype) is the target's; the speculative
    # config's kv_cache_dtype the draft model's, which inherits the target's when unset
    places["kv_cache_dtype"], places["draft_kv_cache_dtype"] = tp("kv_cache_dtype"), sp("kv_cache_dtype")
    return served.ServingConfig(
        engine=ENGINE.name,
        source=source,
        target=served.as_text(top.get("model")),
        drafter=served.as_text(model),
        method=str(method) if method else None,
        drafter_kind=_VLLM_KINDS.get(str(method)) if method else None,
        num_speculative_tokens=k,
        sampling=sampling,
        draft_sampling=draft_sampling,
        extra={k2: v for k2, v in spec.items() if k2 not in used},
        drafting=drafting,
        context_length=served.read_context(top.get("max_model_len"), tp("max_model_len")),
        kv_cache_dtype=served.as_text(top.get("kv_cache_dtype")),
        draft_kv_cache_dtype=served.as_text(spec.get("kv_cache_dtype")),
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


def _vllm_serve(top: Mapping[str, Any], tp: served.Places, source: Path, engine_at: str) -> served.ServingConfig:
    """`vllm serve`'s arguments as a mapping (its --config YAML, or its command line)."""
    spec: dict[str, Any] = {}
    sp = served.Places(tp.prefix)
    if top.get("speculative_config") is not None:
        spec, sp = served.normalised(served.as_mapping(top["speculative_config"], tp("speculative_config")), tp.inside("speculative_config"))
    for arg, key in _VLLM_SPEC_ARGS.items():
        if arg in top:
            spec[key] = top[arg]
            sp.written[key] = tp(arg)
    return _vllm(spec, sp, top, tp, source, engine_at)


_VLLM_SERVE_MARKS = ("speculative_config", *_VLLM_SPEC_ARGS)


def _dotted(value: str) -> Any:
    # vLLM reads --json-arg.key VALUE as JSON, else as the text itself
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


_VLLM_VALUE = frozenset({"--model", "--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens", "--speculative-model", "--num-speculative-tokens", "--override-generation-config", "--generation-config", "--config"})


def _vllm_args(args: list[str], name: str, prog: str, base: dict[str, Any], bp: served.Places, source: Path) -> served.ServingConfig:
    top, tp = dict(base), served.Places(bp.prefix, bp.written)
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



ARG_MARKS = frozenset({"--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens", "--speculative-model", "--num-speculative-tokens", "--override-generation-config"})
ARG_RANK = 1
ENV: Mapping[str, str] = {}


def program(words: list[str], i: int) -> tuple[int, str] | None:
    """`vllm serve` or `python -m vllm.entrypoints.openai.api_server` at words[i]."""
    w = words[i]
    if w.rsplit("/", 1)[-1].lower() == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
        return i + 2, "vllm serve"
    if w == "-m" and i + 1 < len(words):
        module = words[i + 1]
        if module.startswith("vllm.entrypoints.openai.api_server") or module == "vllm.entrypoints.cli.main":
            return i + 2, f"python -m {module}"
    return None


read_args = served.over_config(_vllm_args)  # a vLLM command line over the --config YAML it names


def mapping_rank(d: Mapping[str, Any], dp: served.Places) -> int | None:
    """1: a serve config's speculative_config; 3: its shorthands; 5: a --speculative-config JSON."""
    if "speculative_config" in d:
        return 1
    if any(k in d for k in ("speculative_model", "spec_method", "spec_model", "spec_tokens")):
        return 3
    if any(k in d for k in ("method", "num_speculative_tokens", "draft_sample_method")) or ("model" in d and len(d) > 1):
        return 5
    return None


def read_mapping(d: Mapping[str, Any], dp: served.Places, source: Path) -> served.ServingConfig:
    if "speculative_config" in d:
        return _vllm_serve(d, dp, source, dp("speculative_config"))
    if any(k in d for k in ("speculative_model", "spec_method", "spec_model", "spec_tokens")):
        return _vllm_serve(d, dp, source, dp(next(k for k in _VLLM_SERVE_MARKS if k in d)))
    return _vllm(d, dp, {}, dp, source, dp(next((k for k in ("method", "num_speculative_tokens", "model") if k in d), "model")))


def ngram_spec(sv: served.ServingConfig) -> str | None:
    """vLLM's prompt lookup with its prompt_lookup_min/max and K, or its suffix decoding
    with its suffix_decoding_* knobs, as specprobe's drafter spec (specprobe.drafters.ngram)."""
    if sv.method in ("ngram", "ngram_gpu"):
        knobs = [f"{name}={int(sv.extra[key])}" for name, key in (("min", "prompt_lookup_min"), ("max", "prompt_lookup_max")) if sv.extra.get(key) is not None]
        if sv.num_speculative_tokens is not None:
            knobs.append(f"k={sv.num_speculative_tokens}")
        return "ngram" + (":" + ",".join(knobs) if knobs else "")
    if sv.method == "suffix":  # suffix decoding: its suffix_decoding_* knobs
        knobs = [f"{name}={sv.extra[f'suffix_decoding_{name}']}" for name in ("max_tree_depth", "max_cached_requests", "max_spec_factor", "min_token_prob") if sv.extra.get(f"suffix_decoding_{name}") is not None]
        if sv.num_speculative_tokens is not None:
            knobs.append(f"k={sv.num_speculative_tokens}")
        return "suffix" + (":" + ",".join(knobs) if knobs else "")
    return None
