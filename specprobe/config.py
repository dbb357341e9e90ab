"""Probe config files and serving configs.

`load_probe_config(path)` reads a YAML or TOML probe config into a validated
`ProbeConfig` (pydantic v2): everything the `diagnose`/`check`/`compare` flags hold, so a
CI job is one command (`specprobe diagnose --config FILE`). Unknown keys are errors
that name the key and the file; relative paths are resolved against the file's folder
so a config works from any working directory. Fields left out are None, and
`ProbeConfig.explicit()` returns only what the file set, so command-line flags can
override the file and the command's own defaults fill the rest.

`read_serving_config(path)` reads what an engine is actually launched with — a vLLM
`--speculative-config` JSON (or a `vllm serve --config` YAML) or an SGLang launch
config — and returns the drafter, K and sampling settings found there, so `check` can
catch a temperature set differently in two files.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specprobe.errors import ConfigError

FailOn = Literal["error", "warning", "info", "never"]
Reference = Literal["on-policy", "dataset"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]


class OutputsConfig(BaseModel):
    """Where each report goes (paths relative to the config file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    json_path: Path | None = Field(default=None, alias="json")
    csv: Path | None = None
    html: Path | None = None
    junit: Path | None = None
    markdown: Path | None = None


class ProbeConfig(BaseModel):
    """A probe config: the diagnose/check/compare flags, as a file."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    target: str | None = None
    drafter: str | None = None
    # sampling, target side then drafter side (None: the model's generation_config)
    temperature: float | None = Field(default=None, ge=0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    draft_temperature: float | None = Field(default=None, ge=0)
    draft_top_k: int | None = Field(default=None, ge=0)
    draft_top_p: float | None = Field(default=None, gt=0, le=1)
    # references and prompts
    max_new_tokens: int | None = Field(default=None, gt=0)
    reference: Reference | None = None
    seed: int | None = None
    batch_size: int | None = Field(default=None, gt=0)
    prompts: str | None = None  # "builtin" or a JSONL path
    domains: list[str] | None = None
    max_prompts: int | None = Field(default=None, gt=0)
    # draft lengths: k_max (1..k_max) or an explicit list k
    k_max: int | None = Field(default=None, ge=1, le=64)
    k: list[int] | None = None
    verify_factor: float | None = Field(default=None, gt=0)
    # runtime
    device: str | None = None
    dtype: Dtype | None = None
    # judging and outputs
    rules: list[Path] | None = None
    fail_on: FailOn | None = None
    outputs: OutputsConfig | None = None
    baseline: Path | None = None  # a result JSON for `compare`
    serving_configs: list[Path] | None = None  # vLLM/SGLang configs `check` reads sampling from

    # Where it was read from (not a key users write).
    source: Path | None = Field(default=None, exclude=True)

    @field_validator("device")
    @classmethod
    def _device(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit()):
            return v
        raise ValueError("use auto, cpu, cuda or cuda:N")

    @field_validator("k")
    @classmethod
    def _k_list(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v or any(x < 1 or x > 64 for x in v):
            raise ValueError("K values must be between 1 and 64")
        return sorted(set(v))

    @field_validator("domains")
    @classmethod
    def _domains(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("list at least one domain, or leave the key out for all")
        return v

    @model_validator(mode="after")
    def _k_consistent(self) -> ProbeConfig:
        if self.k is not None and self.k_max is not None and max(self.k) > self.k_max:
            raise ValueError(f"k lists {max(self.k)} but k_max is {self.k_max}; give one of them")
        return self

    @property
    def k_values(self) -> list[int] | None:
        """The draft lengths to evaluate (None: the command's default)."""
        if self.k is not None:
            return list(self.k)
        return list(range(1, self.k_max + 1)) if self.k_max is not None else None

    def explicit(self) -> dict[str, Any]:
        """The fields the file set, by field name (outputs flattened to outputs_<name>)."""
        out: dict[str, Any] = {}
        for name in self.model_fields_set:
            if name in ("source", "outputs"):
                continue
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.outputs is not None:
            for name in self.outputs.model_fields_set:
                value = getattr(self.outputs, name)
                if value is not None:
                    out["outputs_" + ("json" if name == "json_path" else name)] = value
        return out

    def merged(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        """File values overridden by every flag that was given (not None)."""
        merged = self.explicit()
        merged.update({k: v for k, v in flags.items() if v is not None})
        return merged


_PATH_FIELDS = ("rules", "baseline", "serving_configs")
_OUTPUT_FIELDS = ("json", "csv", "html", "junit", "markdown")


def _read_mapping(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text", "save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}", "check the path and its permissions") from None
    if suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ModuleNotFoundError:
                raise ConfigError(f"cannot read TOML config {path} on this Python", "use Python 3.11+, install tomli, or write the config as YAML") from None
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}", "fix the TOML syntax") from None
    elif suffix in (".yaml", ".yml", ".json"):
        import yaml

        try:
            data = yaml.safe_load(text) if suffix != ".json" else json.loads(text)
        except (yaml.YAMLError, json.JSONDecodeError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"config file {path} is not valid {'JSON' if suffix == '.json' else 'YAML'}: {first}", "fix the syntax") from None
    else:
        raise ConfigError(f"config file {path} has extension {suffix or '(none)'!r}", "use .yaml, .yml or .toml")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of keys to values, got a {type(data).__name__}", "see sample_configs/probe-smollm2.yaml")
    return data


def _normalise_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    # Accept CLI spelling (max-new-tokens) as well as field spelling (max_new_tokens).
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _resolve(base: Path, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_resolve(base, v) for v in value]
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def probe_config_from_mapping(data: Mapping[str, Any], source: Path | str = "<config>") -> ProbeConfig:
    """Validate an already-parsed mapping (paths resolved against source's folder)."""
    src = Path(source)
    base = src.parent.resolve() if src.name != "<config>" else Path.cwd()
    raw = _normalise_keys(data)
    allowed = set(ProbeConfig.model_fields) - {"source"}
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{src}: unknown key {key!r}", f"{hint}allowed keys: {', '.join(sorted(allowed))}")
    if isinstance(raw.get("outputs"), Mapping):
        outs = _normalise_keys(raw["outputs"])
        for key in outs:
            if key not in _OUTPUT_FIELDS:
                close = difflib.get_close_matches(key, _OUTPUT_FIELDS, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(f"{src}: unknown key 'outputs.{key}'", f"{hint}allowed: {', '.join(_OUTPUT_FIELDS)}")
        raw["outputs"] = {k: _resolve(base, v) for k, v in outs.items()}
    for key in _PATH_FIELDS:
        if key in raw and raw[key] is not None:
            if key in ("rules", "serving_configs") and isinstance(raw[key], (str, Path)):
                raw[key] = [raw[key]]
            raw[key] = _resolve(base, raw[key])
    # prompts is "builtin" or a path
    if isinstance(raw.get("prompts"), str) and raw["prompts"] != "builtin":
        raw["prompts"] = str(_resolve(base, raw["prompts"]))
    # a single K written as a number
    if isinstance(raw.get("k"), int):
        raw["k"] = [raw["k"]]
    try:
        return ProbeConfig.model_validate({**raw, "source": src})
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        got = first.get("input")
        got_text = f" (got {got!r})" if not isinstance(got, (dict, list)) and got is not None else ""
        more = f"; {e.error_count() - 1} more problem(s)" if e.error_count() > 1 else ""
        raise ConfigError(f"{src}: {loc}: {first['msg']}{got_text}{more}", "see docs/reports.md for the probe config keys") from None


def load_probe_config(path: str | Path) -> ProbeConfig:
    """Read a YAML or TOML probe config; raises ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist", "pass an existing .yaml or .toml file to --config")
    return probe_config_from_mapping(_read_mapping(p), p)


# ----------------------------------------------------------------------------- serving configs
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
_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")


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


def _sampling(d: Mapping[str, Any] | None) -> dict[str, float]:
    if not isinstance(d, Mapping):
        return {}
    out = {}
    for k in _SAMPLING_KEYS:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def _draft_sampling(d: Mapping[str, Any]) -> dict[str, float]:
    return _sampling({k[len("draft_") :]: v for k, v in d.items() if k.startswith("draft_")})


def _vllm(spec: Mapping[str, Any], top: Mapping[str, Any], path: Path) -> ServingConfig:
    method = spec.get("method")
    model = spec.get("model")
    if method is None and model is not None:
        method = "draft_model"  # vLLM infers the method from the model; a plain LM is a draft model
    k = spec.get("num_speculative_tokens")
    sampling = _sampling(spec) or _sampling(_json_value(top.get("override_generation_config"), str(path), "override-generation-config"))
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
        draft_sampling=_draft_sampling(spec),
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
        sampling=_sampling(prefs),
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
    data = _normalise_keys(_read_mapping(p))
    if any(k.startswith("speculative_") and k not in ("speculative_config",) for k in data) or "model_path" in data:
        return _sglang(data, p)
    if "speculative_config" in data:
        spec = _json_value(data["speculative_config"], str(p), "speculative-config")
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{p}: speculative-config must be a mapping", "write it as a JSON object")
        return _vllm(_normalise_keys(spec), data, p)
    if any(k in data for k in ("method", "num_speculative_tokens")) or ("model" in data and len(data) > 1):
        return _vllm(data, {}, p)
    raise ConfigError(
        f"{p} is neither a vLLM speculative config nor an SGLang launch config",
        "expected keys like method/model/num_speculative_tokens (vLLM) or speculative-algorithm/speculative-draft-model-path (SGLang)",
    )


def sampling_conflicts(sources: Mapping[str, Mapping[str, float]], *, tol: float = 1e-6) -> list[str]:
    """One line per sampling key whose value differs between named sources.

    e.g. {"probe.yaml": {"temperature": 0.7}, "sglang.yaml": {"temperature": 1.0}} →
    ["temperature differs: probe.yaml 0.7, sglang.yaml 1.0"]."""
    out = []
    for key in _SAMPLING_KEYS:
        seen = {name: vals[key] for name, vals in sources.items() if key in vals}
        if len(seen) > 1 and max(seen.values()) - min(seen.values()) > tol:
            out.append(f"{key} differs: " + ", ".join(f"{name} {value:g}" for name, value in seen.items()))
    return out


def probe_sampling(cfg: ProbeConfig) -> tuple[dict[str, float], dict[str, float]]:
    """(target side, drafter side) sampling settings a probe config sets."""
    target = {k: float(getattr(cfg, k)) for k in _SAMPLING_KEYS if getattr(cfg, k, None) is not None}
    draft = {k: float(getattr(cfg, f"draft_{k}")) for k in ("temperature", "top_k", "top_p") if getattr(cfg, f"draft_{k}", None) is not None}
    return target, draft
