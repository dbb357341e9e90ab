"""TensorRT-LLM's serving configs (tensorrt_llm/llmapi/llm_args.py): the YAML of
`trtllm-serve --extra_llm_api_options` with `speculative_config: {decoding_type: Eagle3 |
Eagle | MTP | Medusa | DraftTarget | NGram | …, max_draft_len, speculative_model}`; a
trtllm-serve command line is read through the YAML it names. The reader's surface is
`settings.served`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.engines.trtllm import ENGINE
from specprobe.settings.served import (
    Places,
    ServingConfig,
    as_mapping,
    as_text,
    beside,
    normalised,
    read_context,
    read_count,
    replace_config,
    truthy,
)
from specprobe.settings.shell import split_flags

# TensorRT-LLM's PyTorch backend runs "Eagle" as EAGLE-3 (its spec_dec_mode is EAGLE3)
_TRTLLM_KINDS = {"eagle3": "eagle3", "eagle": "eagle3", "mtp": "mtp", "medusa": "medusa", "drafttarget": "independent", "draft_target": "independent"}


def _trtllm(spec: Mapping[str, Any], sp: Places, top: Mapping[str, Any], tp: Places, source: Path) -> ServingConfig:
    decoding = str(spec.get("decoding_type") or "")
    kind = _TRTLLM_KINDS.get(decoding.lower())
    # Medusa's max_draft_len counts the tree's tokens; its chain is one token per head
    k_key = "num_medusa_heads" if kind == "medusa" and "num_medusa_heads" in spec else "max_draft_len"
    if kind == "mtp" and spec.get("max_draft_len") is None and "num_nextn_predict_layers" in spec:
        k_key = "num_nextn_predict_layers"
    drafter_key = "speculative_model" if "speculative_model" in spec else "speculative_model_dir"
    kv_cfg = as_mapping(top["kv_cache_config"], tp("kv_cache_config")) if top.get("kv_cache_config") is not None else {}
    extra = {k2: v for k2, v in spec.items() if k2 not in ("decoding_type", k_key, drafter_key)}
    if spec.get("max_total_draft_tokens") is not None:
        extra["max_total_draft_tokens"] = read_count("draft_tokens", spec["max_total_draft_tokens"], sp("max_total_draft_tokens"))
    if k_key != "max_draft_len" and spec.get("max_draft_len") is not None:
        extra["max_draft_len"] = read_count("draft_tokens", spec["max_draft_len"], sp("max_draft_len"))
    places = {"engine": sp("decoding_type"), "k": sp(k_key)}
    if top.get("model") is not None:
        places["target"] = tp("model")
    if spec.get(drafter_key) is not None:
        places["drafter"] = sp(drafter_key)
    return ServingConfig(
        engine=ENGINE.name,
        source=source,
        target=as_text(top.get("model")),
        drafter=as_text(spec.get(drafter_key)),
        method=decoding or None,
        drafter_kind=kind,
        num_speculative_tokens=read_count("k", spec.get(k_key), sp(k_key)),
        extra=extra,
        context_length=read_context(top.get("max_seq_len"), tp("max_seq_len")),
        # kv_cache_config.dtype (llmapi KvCacheConfig: "auto" | "fp8" …), the one cache of
        # target and draft alike
        kv_cache_dtype=as_text(kv_cfg.get("dtype")),
        places={**places, "context_length": tp("max_seq_len"), **({"kv_cache_dtype": tp.inside("kv_cache_config") + "dtype"} if kv_cfg.get("dtype") is not None else {})},
    )


_TRTLLM_CONFIG = ("--extra-llm-api-options", "--config")



ARG_MARKS: frozenset[str] = frozenset()
ARG_RANK = 3
ENV: Mapping[str, str] = {}


def program(words: list[str], i: int) -> tuple[int, str] | None:
    """trtllm-serve at words[i]."""
    base = words[i].rsplit("/", 1)[-1].lower()
    return (i + 1, base) if base == "trtllm-serve" else None


def read_args(args: list[str], env: Mapping[str, tuple[str, str]], name: str, prog: str, source: Path, read_file: Callable[[Path, Path], ServingConfig]) -> ServingConfig:
    """trtllm-serve's command line, read through the --extra_llm_api_options YAML it names."""
    flags, positional = split_flags(args, frozenset(_TRTLLM_CONFIG), frozenset())
    named = next(((v, w) for f, v, w in flags if f in _TRTLLM_CONFIG and isinstance(v, str)), None)
    if named is None:
        raise ConfigError(f"{name} runs trtllm-serve without --extra_llm_api_options", "its speculative_config is in that YAML: pass it with --extra_llm_api_options, or pass the YAML as the serving config")
    yaml_path = beside(source, named[0])
    cfg = read_file(yaml_path, source)
    if cfg.engine != ENGINE.name:
        raise ConfigError(f"{name}: {named[1]} {yaml_path.name} holds no speculative_config with a decoding_type", "write speculative_config: {decoding_type: …, max_draft_len: …} in it")
    seq = next(((v, w) for f, v, w in flags if f == "--max-seq-len"), None)
    if seq is not None:  # trtllm-serve's flag over its YAML's
        cfg = replace_config(cfg, context_length=read_context(seq[0], f"{name}: {seq[1]}"), places={**cfg.places, "context_length": f"{name}: {seq[1]}"})
    if positional and cfg.target is None:
        return replace_config(cfg, target=positional[0], places={**cfg.places, "target": f"{name}: {prog} MODEL"})
    return cfg


def mapping_rank(d: Mapping[str, Any], dp: Places) -> int | None:
    """0: a speculative_config with a decoding_type (or max_draft_len), or a decoding config itself."""
    spec = d.get("speculative_config")
    inner = as_mapping(spec, dp("speculative_config")) if spec is not None else None
    if inner is not None and any(str(k).replace("-", "_") in ("decoding_type", "max_draft_len") for k in inner):
        return 0
    return 0 if "decoding_type" in d else None


def read_mapping(d: Mapping[str, Any], dp: Places, source: Path) -> ServingConfig:
    spec = d.get("speculative_config")
    inner = as_mapping(spec, dp("speculative_config")) if spec is not None else None
    if inner is not None and any(str(k).replace("-", "_") in ("decoding_type", "max_draft_len") for k in inner):
        s, sp = normalised(inner, dp.inside("speculative_config"))
        return _trtllm(s, sp, d, dp, source)
    return _trtllm(d, dp, {}, dp, source)


def tree_setting(sv: ServingConfig) -> tuple[str, str] | None:
    """The static `eagle_choices` / `medusa_choices` (rank paths), or `use_dynamic_tree`
    with `dynamic_tree_max_topK`, `max_draft_len` (depth) and `max_total_draft_tokens`
    (nodes, the root not counted), as `--tree`."""
    from specprobe.settings.values import parse_tree

    for key in ("eagle_choices", "medusa_choices"):
        choices = sv.extra.get(key)
        if choices:
            text = choices if isinstance(choices, str) else json.dumps(choices)
            return parse_tree(text, f"{sv.source.name}: {key}"), f"{sv.source.name}: {key}"
    if truthy(sv.extra.get("use_dynamic_tree")) and sv.extra.get("dynamic_tree_max_topK") and sv.num_speculative_tokens:
        total = sv.extra.get("max_total_draft_tokens")
        if total is None:
            return None
        where = f"{sv.source.name}: use_dynamic_tree"
        return parse_tree(f"steps={sv.num_speculative_tokens},topk={int(sv.extra['dynamic_tree_max_topK'])},tokens={int(total) + 1}", where), where
    return None


def served_tree(sv: ServingConfig) -> str | None:
    tree = tree_setting(sv)
    return None if tree is None else f"{tree[0]} ({tree[1].split(': ', 1)[-1]}); diagnose estimates this tree"
