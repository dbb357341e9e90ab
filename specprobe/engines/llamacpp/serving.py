"""llama.cpp's serving configs (common/arg.cpp, docs/speculative.md): a llama-server
command line in a launch script or an args file: -m/--model,
-md/--model-draft/--spec-draft-model, -hf/-hfd, --spec-type, --spec-draft-n-max (K),
--spec-draft-n-min, --spec-draft-p-min, --spec-draft-p-split, and the older
--draft-max/--draft/--draft-n, --draft-min/--draft-n-min, --draft-p-min, --draft-p-split;
--temp/--temperature, --top-k, --top-p, --min-p; `--flag value` or `--flag=value`; the
LLAMA_ARG_* variables of a script's `export`, of a command's env prefix or of an env file
(a flag on the command line wins: llama-server reads the environment first). The
reader's surface is `settings.served`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.engines.llamacpp import ENGINE
from specprobe.settings import served
from specprobe.settings.shell import split_flags

_LLAMA_KINDS = {"draft-simple": "independent", "draft": "independent", "draft-eagle3": "eagle3", "draft-mtp": "mtp", "draft-dflash": None, "draft-dspark": None}


# llama-server's n-gram knobs (--spec-ngram-<type>-<knob>) as the drafter spec's knob names
_LLAMA_NGRAM_KNOBS = {
    "ngram-simple": ("size_n", "size_m", "min_hits"),
    "ngram-map-k": ("size_n", "size_m", "min_hits"),
    "ngram-map-k4v": ("size_n", "size_m", "min_hits"),
    "ngram-mod": ("n_match", "n_min", "n_max"),
    "ngram-cache": (),
}


def _llama_ngram_list(sv: served.ServingConfig) -> str | None:
    """llama-server's ngram-* types with their --spec-ngram-* knobs, as a drafter spec."""
    types = [t for t in str(sv.extra.get("spec_type") or sv.method or "").split(",") if t in _LLAMA_NGRAM_KNOBS]
    parts = []
    for t in types:
        knobs = [f"{k}={sv.extra[f'{t}-{k}']}" for k in _LLAMA_NGRAM_KNOBS[t] if sv.extra.get(f"{t}-{k}") is not None]
        parts.append(t + (":" + ",".join(knobs) if knobs else ""))
    return ",".join(parts) or None


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


def _llamacpp(args: list[str], env: Mapping[str, tuple[str, str]], name: str, prog: str, source: Path) -> served.ServingConfig:
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
    places = served.Places(f"{name}: ", at)
    types = [t.strip() for t in str(vals.get("spec_type") or "").split(",") if t.strip()]
    if served.truthy(vals.get("spec_default")) and not types:
        types = ["ngram-mod"]  # --spec-default: llama-server's default speculation
    drafted = [t for t in types if t.startswith("draft")]
    drafter = vals.get("model_draft") or _repo(vals.get("hf_repo_draft"))
    method = drafted[0] if drafted else (types[0] if types else ("draft-simple" if drafter else None))
    kind = _LLAMA_KINDS.get(method or "")
    extra: dict[str, Any] = {"spec_type": ",".join(types)} if types else {}
    for knob in ("p_min", "p_split"):
        if vals.get(knob) is not None:
            extra[knob] = served.read_knob(knob, vals[knob], places(knob))
    if vals.get("n_min") is not None:
        extra["n_min"] = served.read_count("n_min", vals["n_min"], places("n_min"))
    for key in (k2 for k2 in vals if k2.startswith("ngram-")):  # --spec-ngram-<type>-<knob>
        x = int(served.read_number(vals[key], places(key), integer=True))
        low = 0 if key.endswith(("n_min", "n_max")) else 1  # common/arg.cpp's bounds
        if x < low or (not key.endswith("min_hits") and x > 1024):
            raise ConfigError(f"{places(key)} {x} is out of range", f"llama-server takes {low} to 1024" if not key.endswith("min_hits") else "llama-server takes at least 1")
        extra[key] = x
    k = served.read_count("k", vals.get("n_max"), places("n_max"))
    if k is None and (method or "").startswith("draft"):  # the draft types share one n_max
        k, places.written["n_max"] = LLAMA_SERVER_N_MAX, f"{_LLAMA_DEFAULT_AT} --spec-draft-n-max {LLAMA_SERVER_N_MAX}"
    if k is not None:
        extra["n_max"] = k
    if k is not None and extra.get("n_min") is not None and extra["n_min"] > k:
        raise ConfigError(f"{places('n_min')} {extra['n_min']} is more than {places('n_max')} {k}", "the fewest draft tokens cannot exceed the most")
    for key, default in LLAMA_SERVER_DEFAULTS.items():
        if vals.get(key) is None:  # the server's sampler, unless the requests say otherwise
            vals[key], places.written[key] = default, f"{_LLAMA_DEFAULT_AT} {key} {default:g} (a request's own value replaces it)"
    sampling, s_at = served.read_sampling(vals, places)
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
    return served.ServingConfig(
        engine=ENGINE.name,
        source=source,
        target=served.as_text(target),
        drafter=served.as_text(drafter),
        method=method,
        drafter_kind=kind,
        num_speculative_tokens=k,
        sampling=sampling,
        extra=extra,
        context_length=served.read_context(vals.get("ctx_size"), places("ctx_size")),  # 0: the model's own
        kv_cache_dtype=kv,
        draft_kv_cache_dtype=draft_kv,
        places={**cfg_places, "context_length": places("ctx_size"), **kv_places},
    )


def _llama_kv(vals: Mapping[str, Any], places: served.Places, side: str) -> tuple[str | None, str | None]:
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



ARG_MARKS = frozenset(_LLAMA_FLAGS)
ARG_RANK = 0
ENV: Mapping[str, str] = _LLAMA_ENV
DEFAULT_AT = _LLAMA_DEFAULT_AT


def program(words: list[str], i: int) -> tuple[int, str] | None:
    """llama-server at words[i]."""
    base = words[i].rsplit("/", 1)[-1].lower()
    return (i + 1, base) if base in ("llama-server", "llama-server.exe") else None


def read_args(args: list[str], env: Mapping[str, tuple[str, str]], name: str, prog: str, source: Path, read_file: Callable[[Path, Path], served.ServingConfig]) -> served.ServingConfig:
    return _llamacpp(args, env, name, prog, source)


def mapping_rank(d: Mapping[str, Any], dp: served.Places) -> int | None:
    """llama-server has no config file of its own."""
    return None


def read_mapping(d: Mapping[str, Any], dp: served.Places, source: Path) -> served.ServingConfig:
    raise ConfigError(f"{source.name}: llama-server reads no config file", "pass its launch script, args file or env file")


def ngram_spec(sv: served.ServingConfig) -> str | None:
    """llama-server's ngram-* types with their --spec-ngram-* knobs, as specprobe's drafter spec."""
    if any(t.startswith("draft") for t in str(sv.extra.get("spec_type") or "").split(",")):
        return None  # a draft model's type beside n-gram ones: the mix is named with the model (model_spec)
    return _llama_ngram_list(sv)


def model_spec(sv: served.ServingConfig, spec: str) -> str:
    """A draft model with n-gram types beside it: those are tried first (drafters.ngram_mix)."""
    if sv.drafter_kind == "independent":
        ngram = _llama_ngram_list(sv)
        if ngram:
            return f"{ngram}+{spec}"
    return spec


def kv_cache_setting(value: str, where: str) -> str:
    """A llama.cpp KV-cache type as specprobe's --kv-cache-dtype (ggml's types)."""
    from specprobe.settings.model import parse_kv_cache_dtype

    try:
        return parse_kv_cache_dtype(value, where)
    except ConfigError:
        raise ConfigError(
            f"{where} {value!r} is a KV-cache type specprobe does not simulate (it simulates llama.cpp's f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1)",
            "pass --kv-cache-dtype (and --draft-kv-cache-dtype) with the nearest type it simulates, e.g. q4_0 for iq4_nl, to say which to score",
        ) from None
