"""Serving configs: what an engine is actually launched with, and how its sampling
settings meet the ones given on the command line or in a probe config.

`read_serving_config(path)` reads a vLLM `--speculative-config` JSON (or a `vllm serve
--config` YAML) or an SGLang launch config and returns the drafter, K and sampling
settings found there. `resolve_sampling` decides, for each sampling setting of each side,
which of the places that set it wins, names that place ("--temperature",
"probe.yaml", "sglang-launch.yaml"), and returns what each place declared, so the
alignment check can flag a temperature written differently in two places.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specprobe.core.errors import ConfigError
from specprobe.settings.config import normalise_keys, read_mapping
from specprobe.settings.model import BY_NAME, SAMPLING, check

# Engine method names → specprobe drafter kinds (None: no model drafter, e.g. n-gram).
_VLLM_KINDS = {
    "draft_model": "independent",
    "eagle": "eagle3",
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
    "suffix": None,
}
_SGLANG_KINDS = {"EAGLE": "eagle3", "EAGLE3": "eagle3", "STANDALONE": "independent", "NEXTN": "mtp", "MTP": "mtp", "NGRAM": None, "LOOKAHEAD": None}
_SAMPLING_KEYS = tuple(k for k in SAMPLING if not k.startswith("draft_"))  # as engines spell them


@dataclass(frozen=True)
class ServingConfig:
    """What a serving config says about speculative decoding."""

    engine: Literal["vllm", "sglang"]
    source: Path
    target: str | None
    drafter: str | None  # draft model path/name (None for n-gram methods)
    method: str | None  # the engine's own name: "eagle3", "draft_model", "EAGLE3", …
    drafter_kind: str | None  # independent | medusa | mtp | eagle3 | None
    num_speculative_tokens: int | None  # K: draft tokens proposed per step (chain depth)
    sampling: dict[str, float] = field(default_factory=dict)  # target-side sampling found
    draft_sampling: dict[str, float] = field(default_factory=dict)  # drafter-side, when set apart
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific knobs (topk, num_draft_tokens, …)

    @property
    def temperature(self) -> float | None:
        return self.sampling.get("temperature")

    @property
    def draft_temperature(self) -> float | None:
        """The drafter's temperature: its own when set, else the shared one (engines share SamplingParams)."""
        return self.draft_sampling.get("temperature", self.sampling.get("temperature"))


def _json_value(value: Any, where: str, key: str) -> Any:
    # CLI-style configs hold JSON objects as strings: '{"temperature": 0.6}'.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{where}: {key} is not valid JSON: {value[:60]!r}", "write it as a JSON object or a YAML mapping") from None
    return value


def _sampling(d: Mapping[str, Any] | None, path: Path, prefix: str = "") -> dict[str, float]:
    """The sampling values a config sets, each held to the setting's bounds (a serving
    config's temperature is refused with the same words as --temperature's)."""
    if not isinstance(d, Mapping):
        return {}
    out = {}
    for k in _SAMPLING_KEYS:
        v = d.get(prefix + k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            name = prefix + k if prefix + k in BY_NAME else k  # draft_min_p: the target's bounds
            out[k] = float(check(name, float(v), f"{path.name}: {prefix + k}"))
    return out


def _draft_sampling(d: Mapping[str, Any], path: Path) -> dict[str, float]:
    return _sampling(d, path, "draft_")


def _vllm(spec: Mapping[str, Any], top: Mapping[str, Any], path: Path) -> ServingConfig:
    method = spec.get("method")
    model = spec.get("model")
    if method is None and model is not None:
        method = "draft_model"  # vLLM infers the method from the model; a plain LM is a draft model
    k = spec.get("num_speculative_tokens")
    sampling = _sampling(spec, path) or _sampling(_json_value(top.get("override_generation_config"), str(path), "override-generation-config"), path)
    extra = {k2: v for k2, v in spec.items() if k2 not in ("method", "model", "num_speculative_tokens") and k2 not in _SAMPLING_KEYS and not k2.startswith("draft_")}
    extra.update({k2: v for k2, v in spec.items() if k2.startswith("draft_") and k2[6:] not in _SAMPLING_KEYS})
    return ServingConfig(
        engine="vllm",
        source=path,
        target=top.get("model"),
        drafter=model,
        method=method,
        drafter_kind=_VLLM_KINDS.get(str(method)) if method else None,
        num_speculative_tokens=int(k) if isinstance(k, int) else None,
        sampling=sampling,
        draft_sampling=_draft_sampling(spec, path),
        extra=extra,
    )


def _sglang(d: Mapping[str, Any], path: Path) -> ServingConfig:
    algo = d.get("speculative_algorithm")
    steps = d.get("speculative_num_steps")
    prefs = _json_value(d.get("preferred_sampling_params"), str(path), "preferred-sampling-params")
    extra = {k: d[k] for k in ("speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_token_map") if k in d}
    return ServingConfig(
        engine="sglang",
        source=path,
        target=d.get("model_path"),
        drafter=d.get("speculative_draft_model_path"),
        method=str(algo) if algo else None,
        drafter_kind=_SGLANG_KINDS.get(str(algo).upper()) if algo else None,
        # SGLang's chain depth is num_steps; num_draft_tokens counts the whole tree.
        num_speculative_tokens=int(steps) if isinstance(steps, int) else None,
        sampling=_sampling(prefs, path),
        extra=extra,
    )


def read_serving_config(path: str | Path) -> ServingConfig:
    """Read a vLLM speculative-config JSON, a `vllm serve` YAML, or an SGLang launch config.

    Recognised shapes (keys with - or _):
      vLLM  --speculative-config JSON: {"method", "model", "num_speculative_tokens", …}
            plus any sampling keys (temperature, top_p, top_k, min_p; draft_* for the drafter);
      vLLM  serve config: {model, speculative-config: {...}, override-generation-config: {...}};
      SGLang launch config: {model-path, speculative-algorithm, speculative-draft-model-path,
            speculative-num-steps, speculative-eagle-topk, speculative-num-draft-tokens,
            preferred-sampling-params: '{"temperature": …}'}.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"serving config {p} does not exist", "pass the JSON given to vLLM's --speculative-config or SGLang's launch config")
    data = normalise_keys(read_mapping(p), p)
    if any(k.startswith("speculative_") and k not in ("speculative_config",) for k in data) or "model_path" in data:
        return _sglang(data, p)
    if "speculative_config" in data:
        spec = _json_value(data["speculative_config"], str(p), "speculative-config")
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{p}: speculative-config must be a mapping", "write it as a JSON object")
        return _vllm(normalise_keys(spec, f"{p}: speculative-config"), data, p)
    if any(k in data for k in ("method", "num_speculative_tokens")) or ("model" in data and len(data) > 1):
        return _vllm(data, {}, p)
    raise ConfigError(
        f"{p} is neither a vLLM speculative config nor an SGLang launch config",
        "expected keys like method/model/num_speculative_tokens (vLLM) or speculative-algorithm/speculative-draft-model-path (SGLang)",
    )


# ----------------------------------------------------------------------------- sampling from several places
# the drafter's own settings (its min_p is always the target's), then the target's
DRAFT_KEYS = tuple(k for k in SAMPLING if k.startswith("draft_"))
TARGET_KEYS = tuple(k for k in SAMPLING if k not in DRAFT_KEYS)
COMMAND_LINE = "command line"


@dataclass(frozen=True)
class Setting:
    """One sampling value and the place that set it: a flag as typed (`--temperature`)
    or a file's name (`probe.yaml`, `sglang-launch.yaml`)."""

    value: float
    source: str
    from_flag: bool = False


def resolve_sampling(given: Mapping[str, Setting], servings: Sequence[ServingConfig]) -> tuple[dict[str, Setting], dict[str, dict[str, float]]]:
    """The explicit sampling setting that wins for each SamplingFlags field, and what
    each place declared (for the alignment check's config-conflict rule).

    A flag typed for this run wins, then the probe config, then the serving configs in
    the order given: a serving config's shared settings are the target's (engines give
    the drafter the same unless told otherwise), its draft_* ones the drafter's.
    Anything not set here falls back, later, to the target's generation_config and the
    engine's defaults."""
    chosen: dict[str, Setting] = {}
    for key in TARGET_KEYS + DRAFT_KEYS:
        found = [given[key]] if key in given else []
        if key in DRAFT_KEYS:
            base = key[len("draft_") :]
            found += [Setting(sv.draft_sampling[base], sv.source.name) for sv in servings if base in sv.draft_sampling]
        else:
            found += [Setting(sv.sampling[key], sv.source.name) for sv in servings if key in sv.sampling]
        if found:
            chosen[key] = found[0]
    declared: dict[str, dict[str, float]] = {}
    for key in TARGET_KEYS:
        if key in given:
            name = COMMAND_LINE if given[key].from_flag else given[key].source
            declared.setdefault(name, {})[key] = given[key].value
    for sv in servings:
        if sv.sampling:
            declared.setdefault(sv.source.name, {}).update(sv.sampling)
    return chosen, declared


def describe_serving(sv: ServingConfig) -> str:
    """One line: the engine, drafter, K and sampling a serving config sets."""
    engine = {"vllm": "vLLM", "sglang": "SGLang"}[sv.engine]
    method = f" ({sv.method}{', ' + sv.drafter_kind if sv.drafter_kind else ''})" if sv.method else ""
    k_name = "speculative-num-steps" if sv.engine == "sglang" else "num_speculative_tokens"
    k = f"K = {sv.num_speculative_tokens} ({k_name})" if sv.num_speculative_tokens else "K not set"
    sampling = ", ".join(f"{k2} {v:g}" for k2, v in {**sv.sampling, **{f"draft_{k3}": v3 for k3, v3 in sv.draft_sampling.items()}}.items()) or "no sampling settings"
    return f"{sv.source.name} ({engine}): drafter {sv.drafter or 'none'}{method}, {k}, {sampling}"
