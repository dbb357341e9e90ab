"""Probe config files: a run's flags, as a YAML or TOML file.

`load_probe_config(path)` reads a probe config into a validated `ProbeConfig`
(pydantic v2), so a CI job is one command (`specprobe diagnose --config FILE`). Each key
is one command-line flag (the table is `specprobe.settings.model.SETTINGS`). Unknown keys are errors
that name the key and the file; relative paths are resolved against the file's folder
so a config works from any working directory. Fields left out are None, and
`ProbeConfig.explicit()` returns only what the file set, so command-line flags can
override the file and the command's own defaults fill the rest.

Serving configs (what an engine is launched with) are read by `specprobe.settings.serving`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from specprobe.core.errors import ConfigError
from specprobe.core.safe_load import UnsafeDocument, load_json, load_yaml
from specprobe.settings.model import BY_FILE_KEY, SETTINGS, Setting, check
from specprobe.settings.values import K_LIMIT  # noqa: F401  (re-exported: the limit beside the keys it bounds)


class OutputsConfig(BaseModel):
    """Where each report goes (paths relative to the config file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    json_path: Path | None = Field(default=None, alias="json")
    csv: Path | None = None
    html: Path | None = None
    junit: Path | None = None
    markdown: Path | None = None


class _ProbeConfigBase(BaseModel):
    """The keys' types come from the settings model (one field per setting with a file
    key); their bounds are checked by `settings.model.check` after the types, so a file
    is refused with the same words as a flag."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    outputs: OutputsConfig | None = None
    # Where it was read from (not a key users write).
    source: Path | None = Field(default=None, exclude=True)

    @field_validator("device", check_fields=False)
    @classmethod
    def _device(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit()):
            return v
        raise ValueError("use auto, cpu, cuda or cuda:N")

    @field_validator("domains", check_fields=False)
    @classmethod
    def _domains(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("list at least one domain, or leave the key out for all")
        return v

    @field_validator("k", "batch_sizes", check_fields=False)
    @classmethod
    def _sorted_list(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and not v:
            raise ValueError("list at least one value, or leave the key out")
        return sorted(set(v)) if v is not None else v

    @model_validator(mode="after")
    def _k_consistent(self) -> _ProbeConfigBase:
        k, k_max = getattr(self, "k", None), getattr(self, "k_max", None)
        if k is not None and k_max is not None and max(k) > k_max:
            raise ValueError(f"k lists {max(k)} but k_max is {k_max}; give one of them")
        return self

    @property
    def k_values(self) -> list[int] | None:
        """The draft lengths to evaluate (None: the command's default)."""
        k, k_max = getattr(self, "k", None), getattr(self, "k_max", None)
        if k is not None:
            return list(k)
        return list(range(1, k_max + 1)) if k_max is not None else None

    def explicit(self) -> dict[str, Any]:
        """The keys the file set, as written in it (outputs flattened to outputs.<name>)."""
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
                    out["outputs." + ("json" if name == "json_path" else name)] = value
        return out


def _file_type(s: Setting) -> Any:
    t = s.file_type if s.file_type is not None else s.type
    if s.choices:  # a choice is checked with the flag's words, not pydantic's
        t = str
    return t | None


# A probe config: the check/diagnose/simulate/compare flags, as a file.
ProbeConfig = create_model(  # type: ignore[call-overload]
    "ProbeConfig",
    __base__=_ProbeConfigBase,
    __doc__="A probe config: the check/diagnose/simulate/compare flags, as a file.",
    **{s.file_key: (_file_type(s), None) for s in SETTINGS if s.file_key is not None and "." not in s.file_key},
)


_PATH_FIELDS = ("rules", "baseline", "serving_configs")
_OUTPUT_FIELDS = ("json", "csv", "html", "junit", "markdown")


def read_text(path: Path, what: str = "config file") -> str:
    """A config file's text, or one line saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text", "save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}", "check the path and its permissions") from None


def read_mapping(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    text = read_text(path)
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
        except RecursionError:
            raise ConfigError(f"config file {path} is nested too deeply to read", "a config is a flat mapping of keys to values") from None
    elif suffix in (".yaml", ".yml", ".json"):
        import yaml


        try:
            data = load_yaml(text) if suffix != ".json" else load_json(text)
        except UnsafeDocument as e:
            raise ConfigError(f"config file {path} refused: {e}", e.hint) from None
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


def normalise_keys(data: Mapping[str, Any], where: Path | str = "config") -> dict[str, Any]:
    """CLI spelling (max-new-tokens) and field spelling (max_new_tokens) both accepted; a key
    given under both spellings is refused, never resolved by whichever came last."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for k, v in data.items():
        key = str(k).replace("-", "_")
        if key in spelled:
            raise ConfigError(f"{where}: {spelled[key]!r} and {str(k)!r} are the same key given twice", f"keep one of them (as {key!r})")
        spelled[key] = str(k)
        out[key] = v
    return out


def _resolve(base: Path, value: Any, where: str) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_resolve(base, v, where) for v in value]
    if not str(value).strip():
        # an unset CI variable written into the file: never the config's own folder
        raise ConfigError(f"{where} is an empty path", "give it a file name or leave the key out")
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def probe_config_from_mapping(data: Mapping[str, Any], source: Path | str = "<config>") -> _ProbeConfigBase:
    """Validate an already-parsed mapping (paths resolved against source's folder)."""
    src = Path(source)
    base = src.parent.resolve() if src.name != "<config>" else Path.cwd()
    raw = normalise_keys(data, src)
    allowed = set(ProbeConfig.model_fields) - {"source"}
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{src}: unknown key {key!r}", f"{hint}allowed keys: {', '.join(sorted(allowed))}")
    if isinstance(raw.get("outputs"), Mapping):
        outs = normalise_keys(raw["outputs"], f"{src}: outputs")
        for key in outs:
            if key not in _OUTPUT_FIELDS:
                close = difflib.get_close_matches(key, _OUTPUT_FIELDS, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(f"{src}: unknown key 'outputs.{key}'", f"{hint}allowed: {', '.join(_OUTPUT_FIELDS)}")
        raw["outputs"] = {k: _resolve(base, v, f"{src}: outputs.{k}") for k, v in outs.items()}
    for key in _PATH_FIELDS:
        if key in raw and raw[key] is not None:
            if key in ("rules", "serving_configs") and isinstance(raw[key], (str, Path)):
                raw[key] = [raw[key]]
            raw[key] = _resolve(base, raw[key], f"{src}: {key}")
    # prompts is "builtin" or a path
    if isinstance(raw.get("prompts"), str) and raw["prompts"] not in ("builtin", "-"):  # "-": stdin
        raw["prompts"] = str(_resolve(base, raw["prompts"], f"{src}: prompts"))
    # a single K (or batch size) written as a number
    for key in ("k", "batch_sizes"):
        if isinstance(raw.get(key), int):
            raw[key] = [raw[key]]
    try:
        pc: _ProbeConfigBase = ProbeConfig.model_validate({**raw, "source": src})
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"] if not isinstance(x, int)) or "(top level)"
        got = first.get("input")
        more = f"; {e.error_count() - 1} more problem(s)" if e.error_count() > 1 else ""
        if first["type"] == "finite_number":  # an int key given nan/inf: the words of every other non-finite value
            raise ConfigError(f"{src.name}: {loc} {got!r} is not a finite number{more}", "write a number") from None
        got_text = f" (got {got!r})" if not isinstance(got, (dict, list)) and got is not None else ""
        raise ConfigError(f"{src.name}: {loc}: {first['msg']}{got_text}{more}", "see docs/settings.md for the probe config keys") from None
    for key, value in pc.explicit().items():  # the bounds, in the same words as for a flag
        s = BY_FILE_KEY[key]
        where = f"{src.name}: {key}"
        if s.parse is not None and isinstance(value, str):
            s.parse(value, where)
        check(s.name, value, where)
    return pc


def load_probe_config(path: str | Path) -> _ProbeConfigBase:
    """Read a YAML or TOML probe config; raises ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist", "pass an existing .yaml or .toml file to --config")
    return probe_config_from_mapping(read_mapping(p), p)
