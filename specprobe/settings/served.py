"""What every engine's serving-config reader shares: the `ServingConfig` they return,
where each value was written (`Places`), and the reading of numbers, counts, context
lengths, sampling settings and nested mappings, each held to the bounds of the setting it
is (`settings.model.check`) or of the engine knob (`_KNOBS`).

The readers themselves are one module per engine, `specprobe.engines.<engine>.serving`;
`reader(name)` finds one by asking the engine registry, and `settings.serving` is the
front that picks the reader a file is for. A reader module holds:

  ARG_MARKS: frozenset[str]   flags that say an args file (no program named) is its engine's
  ARG_RANK: int               the order engines are named in when an args file mixes them
  ENV: Mapping[str, str]      environment variables it reads (an env file is its engine's)
  program(words, i) -> (index of the first argument, the program as written) | None
                              whether words[i] starts its engine (however it is wrapped)
  read_args(args, env, name, prog, source, read_file) -> ServingConfig
                              a command line (or an args file, prog ""), with the
                              environment given it; read_file(path, source) reads a config
                              file the command line names, as the front reads one
  mapping_rank(d, dp) -> int | None
                              how surely a JSON/YAML mapping (keys with _; dp: where each was
                              written) is its engine's:
                              the lowest rank of all readers wins, None: not its
  read_mapping(d, dp, source) -> ServingConfig
and, where its engine has them: ngram_spec(sv) (the drafter spec of a method that drafts
without a model), model_spec(sv, spec) (what it drafts beside the model), tree_setting(sv)
and served_tree(sv) (the draft tree it verifies), kv_cache_setting(value, where) (its
KV-cache types as --kv-cache-dtype) and DEFAULT_AT (how a value it did not read, the
engine's own default, names its place).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.engines import ENGINES
from specprobe.settings.config import normalise_keys, read_mapping
from specprobe.settings.model import BY_NAME, SAMPLING, Setting, check, check_bounds
from specprobe.settings.shell import split_flags

# a specprobe drafter spec for each kind ({} the engine's drafter path)
_SPEC_OF_KIND = {"independent": "{}", "eagle3": "eagle3:{}", "eagle": "eagle:{}", "medusa": "medusa:{}"}


TARGET_SAMPLING = tuple(k for k in SAMPLING if not k.startswith("draft_"))  # as engines spell them


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



def reader(name: str) -> ModuleType | None:
    """The serving-config reader of the engine called `name` (None: it reads none)."""
    return _readers().get(name)


def readers() -> tuple[ModuleType, ...]:
    """Every engine's serving-config reader, in the registry's order."""
    return tuple(_readers().values())


@cache
def _readers() -> dict[str, ModuleType]:
    """Engine name → its package's `serving` module, for each engine that has one (an
    engine without a serving config has none)."""
    found = {}
    for e in ENGINES:
        module = type(e).__module__ + ".serving"
        if importlib.util.find_spec(module) is not None:
            found[e.name] = importlib.import_module(module)
    return found


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
        at: str | None = getattr(reader(self.engine), "DEFAULT_AT", None)
        return at is not None and self.where(what).startswith(at)

    @property
    def drafter_spec(self) -> str | None:
        """The drafter as specprobe names it: a head gets its kind's prefix; the target's
        own MTP layers are 'mtp'; None where the engine drafts without a model."""
        if self.drafter_kind == "mtp":
            return "mtp"
        if self.drafter_kind is None and self.method:
            ngram = getattr(reader(self.engine), "ngram_spec", None)
            return ngram(self) if ngram else None
        pattern = _SPEC_OF_KIND.get(self.drafter_kind or "")
        spec = pattern.format(self.drafter) if pattern and self.drafter else None
        mixed = getattr(reader(self.engine), "model_spec", None)  # what the engine drafts beside the model (llama.cpp's n-gram types)
        return mixed(self, spec) if spec and mixed else spec


class Places:
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


def normalised(data: Mapping[str, Any], prefix: str) -> tuple[dict[str, Any], Places]:
    """Keys with - or _ (a key given under both spellings is refused), and where each was written."""
    out = normalise_keys(data, prefix.rstrip(". :") or "config")
    return out, Places(prefix, {str(k).replace("-", "_"): f"{prefix}{k}" for k in data})


def _json_value(value: Any, where: str) -> Any:
    # command-line configs hold JSON objects as strings: '{"temperature": 0.6}'
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{where} is not valid JSON: {value[:60]!r}", "write it as a JSON object or a YAML mapping") from None
    return value


def as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    value = _json_value(value, where)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping, not {type(value).__name__}", "write it as a JSON object or a YAML mapping")
    return value


def read_number(value: Any, where: str, integer: bool = False) -> float | int:
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


def read_count(name: str, value: Any, where: str) -> int | None:
    """K or a knob that counts tokens, checked with the setting's (or knob's) bounds."""
    if value is None:
        return None
    x = read_number(value, where, integer=True)
    if name in _KNOBS:
        check_bounds(_KNOBS[name], x, where)
    else:
        check(name, x, where)
    return int(x)


_SIZED = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG])$")


def read_context(value: Any, where: str) -> int | None:
    """A served context length: vLLM writes 32k (10³) or 32K (2¹⁰) as well; -1, 0 and
    'auto' leave it to the model's own."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("auto", "-1", "0")) or value in (-1, 0):
        return None
    m = _SIZED.match(value.strip()) if isinstance(value, str) else None
    if m:
        power = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
        value = int(float(m.group(1)) * power)
    return read_count("context_length", value, where)


def read_knob(name: str, value: Any, where: str) -> float:
    x = float(read_number(value, where))
    check_bounds(_KNOBS[name], x, where)
    return x


def read_sampling(d: Mapping[str, Any], places: Places, prefix: str = "") -> tuple[dict[str, float], dict[str, str]]:
    """The sampling values a mapping sets (`prefix` draft_: the drafter's), each held to
    its setting's bounds — a serving config's temperature is refused in --temperature's
    words — and where each was written, by setting name."""
    out: dict[str, float] = {}
    where: dict[str, str] = {}
    for k in TARGET_SAMPLING:
        v = d.get(prefix + k)
        if v is None:
            continue
        at = places(prefix + k)
        name = prefix + k if prefix + k in BY_NAME else k  # draft_min_p: the target's bounds
        if k == "top_k":
            n = read_number(v, at, integer=True)
            x: float = 0.0 if n == -1 else float(n)  # -1: the engines' own spelling of "off"
        else:
            x = float(read_number(v, at))
        out[k] = float(check(name, x, at))
        where[prefix + k] = at
    return out, where


def read_drafting(value: Any, where: str) -> str | None:
    return None if value is None else str(check("draft_sampling", value, where))


def truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"))


def as_text(value: Any) -> str | None:
    return None if value is None else str(value)


def beside(script: Path, named: str) -> Path:
    """A file a launch script names, relative to the script's folder."""
    p = Path(named).expanduser()
    p = p if p.is_absolute() else script.parent / p
    if not p.is_file():
        raise ConfigError(f"{script.name} names {named}, which does not exist (read relative to {script.parent})", "give the path as the script runs it, or pass that file as the serving config")
    return p


def replace_config(cfg: ServingConfig, **changes: Any) -> ServingConfig:
    return ServingConfig(**{**cfg.__dict__, **changes})


def engine_config(args: list[str], name: str, source: Path) -> tuple[dict[str, Any], Places]:
    """The --config YAML a vLLM or SGLang command line names: its flags go over it, as the engines do."""
    flags, _ = split_flags(args, frozenset({"--config"}), frozenset())
    named = next((v for f, v, _w in flags if f == "--config" and isinstance(v, str)), None)
    if named is None:
        return {}, Places(f"{name}: ")
    path = beside(source, named)
    return normalised(read_mapping(path), f"{path.name}: ")


def over_config(read: Callable[[list[str], str, str, dict[str, Any], Places, Path], ServingConfig]) -> Callable[[list[str], Mapping[str, tuple[str, str]], str, str, Path, Callable[[Path, Path], ServingConfig]], ServingConfig]:
    """An engine's `read_args` for a vLLM or SGLang command line: `read` (args, name, prog,
    base, places, source) takes its flags over the --config YAML it names."""

    def read_args(args: list[str], env: Mapping[str, tuple[str, str]], name: str, prog: str, source: Path, read_file: Callable[[Path, Path], ServingConfig]) -> ServingConfig:
        base, bp = engine_config(args, name, source)
        return read(args, name, prog, base, bp, source)

    return read_args
