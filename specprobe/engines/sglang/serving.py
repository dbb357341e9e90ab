"""SGLang's serving configs (python/sglang/srt/server_args.py): a `--config` YAML or a
`python -m sglang.launch_server` command line: --model-path (--model),
--speculative-algorithm, --speculative-draft-model-path (-model), --speculative-num-steps
(K, the chain depth), --speculative-eagle-topk, --speculative-num-draft-tokens,
--speculative-accept-threshold-single/-acc, --speculative-use-rejection-sampling (drafts
sampled, accepted by rejection sampling), --preferred-sampling-params '{"temperature": …}'.
The reader's surface is `settings.served`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.engines import PROBABILISTIC
from specprobe.engines.sglang import ENGINE
from specprobe.settings import served
from specprobe.settings.shell import split_flags

_SGLANG_KINDS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "STANDALONE": "independent", "NEXTN": "mtp", "MTP": "mtp", "NGRAM": None, "LOOKAHEAD": None, "DFLASH": None}


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
    x = int(served.read_number(value, where, integer=True))
    low = 2 if key == "branch_length" else 1
    if x < low:
        raise ConfigError(f"{where} {x} is below {low}", f"SGLang's NGRAM takes {key} of at least {low}")
    return x


def _sglang(d: Mapping[str, Any], dp: served.Places, source: Path, engine_at: str) -> served.ServingConfig:
    algo = d.get("speculative_algorithm")
    places: dict[str, str] = {}
    drafter_key = "speculative_draft_model_path" if "speculative_draft_model_path" in d else "speculative_draft_model"
    target_key = "model_path" if "model_path" in d else "model"
    extra: dict[str, Any] = {}
    for key, knob in _SGLANG_KNOBS.items():
        if d.get(key) is not None:
            extra[key] = served.read_count(knob, d[key], dp(key)) if knob in ("topk", "num_draft_tokens") else served.read_knob(knob, d[key], dp(key))
    for key in ("speculative_token_map", "speculative_draft_model_revision", "speculative_dflash_block_size", "speculative_adaptive"):
        if key in d:
            extra[key] = d[key]
    for key in _SGLANG_NGRAM_KNOBS:  # NGRAM's knobs, read as its drafter spec's (models.sglang_ngram)
        name = f"speculative_ngram_{key}"
        if d.get(name) is not None:
            extra[name] = _ngram_knob(key, d[name], dp(name))
            places[name] = dp(name)
    # rejection sampling needs the drafter's probabilities: the drafts are sampled from q
    rejection = served.truthy(d.get("speculative_use_rejection_sampling"))
    if rejection:
        extra["speculative_use_rejection_sampling"] = True
    sampling: dict[str, float] = {}
    at: dict[str, str] = {}
    if d.get("preferred_sampling_params") is not None:
        prefs, pp = served.normalised(served.as_mapping(d["preferred_sampling_params"], dp("preferred_sampling_params")), dp.inside("preferred_sampling_params"))
        sampling, at = served.read_sampling(prefs, pp)
    places = {**places, "engine": engine_at, "k": dp("speculative_num_steps"), "drafting": dp("speculative_use_rejection_sampling"), **{key: dp(key) for key in _SGLANG_KNOBS}, **at}
    if d.get(target_key) is not None:
        places["target"] = dp(target_key)
    if d.get(drafter_key) is not None:
        places["drafter"] = dp(drafter_key)
    return served.ServingConfig(
        engine=ENGINE.name,
        source=source,
        target=served.as_text(d.get(target_key)),
        drafter=served.as_text(d.get(drafter_key)),
        method=str(algo) if algo else None,
        drafter_kind=_SGLANG_KINDS.get(str(algo).upper()) if algo else None,
        # SGLang's chain depth is num_steps; num_draft_tokens counts the whole tree
        num_speculative_tokens=served.read_count("k", d.get("speculative_num_steps"), dp("speculative_num_steps")),
        sampling=sampling,
        extra=extra,
        drafting=PROBABILISTIC if rejection else None,
        context_length=served.read_context(d.get("context_length"), dp("context_length")),
        kv_cache_dtype=served.as_text(d.get("kv_cache_dtype")),
        draft_kv_cache_dtype=served.as_text(d.get("speculative_draft_kv_cache_dtype")),  # unset: --kv-cache-dtype's
        places={**places, "context_length": dp("context_length"), "kv_cache_dtype": dp("kv_cache_dtype"), "draft_kv_cache_dtype": dp("speculative_draft_kv_cache_dtype")},
    )


_SGLANG_ALIASES = {"model": "model_path", "speculative_draft_model": "speculative_draft_model_path"}


_SGLANG_VALUE = frozenset({"--model-path", "--model", "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model", "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-accept-threshold-single", "--speculative-accept-threshold-acc", "--speculative-token-map", "--preferred-sampling-params", "--config", *(f"--speculative-ngram-{k.replace('_', '-')}" for k in _SGLANG_NGRAM_KNOBS)})


_SGLANG_BOOL = frozenset({"--speculative-use-rejection-sampling", "--trust-remote-code", "--enable-metrics", "--speculative-adaptive"})


def _sglang_args(args: list[str], name: str, prog: str, base: dict[str, Any], bp: served.Places, source: Path) -> served.ServingConfig:
    d, dp = dict(base), served.Places(bp.prefix, bp.written)
    flags, _ = split_flags(args, _SGLANG_VALUE, _SGLANG_BOOL)
    for flag, value, written in flags:
        if flag.startswith("--") and flag != "--config":
            key = flag[2:].replace("-", "_")
            key = _SGLANG_ALIASES.get(key, key)
            d[key], dp.written[key] = value, f"{name}: {written}"
    return _sglang(d, dp, source, f"{name}: {prog}")



ARG_MARKS = frozenset(f for f in _SGLANG_VALUE | _SGLANG_BOOL if f.startswith("--speculative") or f in ("--model-path", "--preferred-sampling-params"))
ARG_RANK = 2
ENV: Mapping[str, str] = {}


def program(words: list[str], i: int) -> tuple[int, str] | None:
    """`python -m sglang.launch_server` at words[i]."""
    if words[i] == "-m" and i + 1 < len(words) and words[i + 1].startswith("sglang.launch_server"):
        return i + 2, f"python -m {words[i + 1]}"
    return None


read_args = served.over_config(_sglang_args)  # an SGLang command line over the --config YAML it names


def mapping_rank(d: Mapping[str, Any], dp: served.Places) -> int | None:
    """2: a launch config's own keys; 4: any other speculative_* key."""
    if any(k in d for k in _SGLANG_MARKS):
        return 2
    if any(k.startswith("speculative_") for k in d):
        return 4
    return None


def read_mapping(d: Mapping[str, Any], dp: served.Places, source: Path) -> served.ServingConfig:
    if any(k in d for k in _SGLANG_MARKS):
        return _sglang(d, dp, source, dp(next(k for k in _SGLANG_MARKS if k in d)))
    return _sglang(d, dp, source, dp(next(k for k in d if k.startswith("speculative_"))))


def ngram_spec(sv: served.ServingConfig) -> str | None:
    """SGLang's NGRAM with its speculative_ngram_* knobs and speculative_num_draft_tokens
    (its tree's size), as specprobe's drafter spec (specprobe.drafters.ngram)."""
    if str(sv.method).upper() == "NGRAM":  # its speculative_ngram_* knobs and the tree's size
        knobs = [f"{key}={sv.extra[f'speculative_ngram_{key}']}" for key in _SGLANG_NGRAM_KNOBS if sv.extra.get(f"speculative_ngram_{key}") is not None]
        if sv.extra.get("speculative_num_draft_tokens") is not None:
            knobs.append(f"num_draft_tokens={int(sv.extra['speculative_num_draft_tokens'])}")
        return "sglang-ngram" + (":" + ",".join(knobs) if knobs else "")
    return None


def tree_setting(sv: served.ServingConfig) -> tuple[str, str] | None:
    """speculative-eagle-topk > 1 with its num_steps and num_draft_tokens, as `--tree`."""
    from specprobe.settings.values import parse_tree

    if str(sv.method).upper() == "NGRAM":  # its tree is the drafter's own (sglang-ngram), not a --tree shape
        return None
    topk, tokens, steps = sv.extra.get("speculative_eagle_topk"), sv.extra.get("speculative_num_draft_tokens"), sv.num_speculative_tokens
    if topk is None or int(topk) <= 1 or tokens is None or steps is None:
        return None
    where = sv.where("speculative_eagle_topk")
    return parse_tree(f"steps={steps},topk={topk},tokens={tokens}", where), where


def served_tree(sv: served.ServingConfig) -> str | None:
    """EAGLE/STANDALONE with speculative-eagle-topk > 1 drafts topk candidates per step,
    num_steps deep, and verifies num_draft_tokens of them in one pass (topk 1 and
    num_draft_tokens num_steps + 1 is the chain)."""
    if str(sv.method).upper() == "NGRAM":  # NGRAM: the drafter spec carries its tree
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
