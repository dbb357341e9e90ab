"""The settings of a run: one options object for check, diagnose, simulate (and compare's
inputs), built by one merge — flags typed on the command line over a probe config file
over the command's defaults — and validated before any model loads or file is written.

`KEYS` is the table: each probe-config key is exactly one command-line flag, and every
validation error names the place a value came from (`--k-max`, or `probe.yaml: k_max`).
This module owns that table, `RunOptions`, the merge and its validation, and the parsers
of list-valued flags (`--k`, `--batch-sizes`). `RunOptions` then builds the pipeline's
own settings (`DiagnoseConfig`, `SimulateConfig`, in `specprobe.settings.pipeline`), which
the pipeline reads and never merges again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specprobe.core.errors import ConfigError, OutputError
from specprobe.core.files import OutputPath, check_outputs
from specprobe.settings.pipeline import DiagnoseConfig, SimulateConfig
from specprobe.settings.values import K_LIMIT, parse_batch_sizes, parse_ks

if TYPE_CHECKING:
    from specprobe.settings.pipeline import SamplingFlags

DTYPES = ("auto", "float32", "bfloat16", "float16")
REFERENCES = ("on-policy", "dataset")
SEMANTICS = ("vllm", "sglang", "transformers")  # whose sampling transform and defaults
FAIL_ON = ("error", "warning", "info", "never")

CHECK, DIAGNOSE, SIMULATE, COMPARE, DEMO = "check", "diagnose", "simulate", "compare", "demo"
_RUNS = frozenset({DIAGNOSE, SIMULATE})
_MODELS = frozenset({CHECK, DIAGNOSE, SIMULATE})


@dataclass(frozen=True)
class Key:
    """One probe-config key = one command-line parameter."""

    key: str  # as written in a probe config ("outputs.json" for a nested one)
    param: str  # the command function's parameter name
    flag: str  # as typed on the command line ("TARGET" for an argument)
    commands: frozenset[str]  # the commands that have the flag
    from_file: frozenset[str] | None = None  # commands that take the key from a file (None: all of them)

    def file_applies(self, command: str) -> bool:
        return command in (self.from_file if self.from_file is not None else self.commands)


def _k(key: str, flag: str, commands: frozenset[str], param: str | None = None, from_file: frozenset[str] | None = None) -> Key:
    return Key(key, param or key, flag, commands, from_file)


KEYS: tuple[Key, ...] = (
    _k("target", "TARGET", _MODELS),
    _k("drafter", "DRAFTER", _MODELS),
    _k("temperature", "--temperature", _MODELS),
    _k("top_k", "--top-k", _MODELS),
    _k("top_p", "--top-p", _MODELS),
    _k("min_p", "--min-p", _MODELS),
    _k("draft_temperature", "--draft-temperature", _MODELS),
    _k("draft_top_k", "--draft-top-k", _MODELS),
    _k("draft_top_p", "--draft-top-p", _MODELS),
    _k("sampling_semantics", "--sampling-semantics", _MODELS),
    _k("prompts", "--prompts", _RUNS),
    _k("domains", "--domains", _RUNS),
    _k("max_prompts", "--max-prompts", _RUNS),
    _k("max_new_tokens", "--max-new-tokens", _RUNS),
    _k("reference", "--reference", _RUNS),
    _k("seed", "--seed", _RUNS),
    _k("batch_size", "--batch-size", _RUNS),
    _k("batch_sizes", "--batch-sizes", _RUNS),
    _k("k_max", "--k-max", _RUNS),
    _k("k", "--k", frozenset({SIMULATE, COMPARE})),
    _k("adaptive_threshold", "--adaptive-threshold", frozenset({SIMULATE})),
    _k("verify_factor", "--verify-factor", _RUNS),
    _k("cost_ratio", "--cost-ratio", _RUNS),
    _k("device", "--device", _RUNS),
    _k("dtype", "--dtype", _RUNS),
    _k("device_map", "--device-map", frozenset({DIAGNOSE})),
    _k("max_memory", "--max-memory", frozenset({DIAGNOSE})),
    _k("force", "--force", _RUNS),
    _k("no_cache", "--no-cache", _RUNS),
    _k("brief", "--brief", frozenset({DIAGNOSE})),
    _k("shard", "--shard", frozenset({DIAGNOSE})),
    _k("rules", "--rules", _MODELS | {COMPARE}),
    _k("fail_on", "--fail-on", _MODELS | {COMPARE}),
    # A file's outputs are where the run it configures writes: `check` and `compare` write
    # only where their own flags say, never over a diagnose result (or its reports).
    _k("outputs.json", "--json", _MODELS | {COMPARE}, "json_path", _RUNS),
    _k("outputs.csv", "--csv", _RUNS | {COMPARE}, "csv_dir", _RUNS),
    _k("outputs.html", "--html", _RUNS | {COMPARE}, "html", _RUNS),
    _k("outputs.junit", "--junit", _RUNS | {COMPARE}, "junit", _RUNS),
    _k("outputs.markdown", "--markdown", _RUNS | {COMPARE}, "markdown", _RUNS),
    _k("serving_configs", "--serving-config", frozenset({CHECK}), "serving_config"),
    _k("baseline", "BASELINE.json", frozenset({COMPARE})),
)
KEY_BY_PARAM = {k.param: k for k in KEYS}
_OUTPUT_KINDS = {"json_path": "file", "csv_dir": "dir", "html": "file", "junit": "file", "markdown": "file"}
_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "draft_temperature", "draft_top_k", "draft_top_p")
# where effective_sampling() files each setting
SAMPLING_SLOT = {
    "temperature": "target.temperature",
    "top_k": "target.top_k",
    "top_p": "target.top_p",
    "min_p": "target.min_p",
    "draft_temperature": "draft.temperature",
    "draft_top_k": "draft.top_k",
    "draft_top_p": "draft.top_p",
}


@dataclass(frozen=True)
class RunOptions:
    """Everything a command was told, merged; `origins` says where each value came from:
    the flag as typed, `FILE: key`, or "default"."""

    command: str
    target: str | None = None
    drafter: str | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    draft_temperature: float | None = None
    draft_top_k: int | None = None
    draft_top_p: float | None = None
    sampling_semantics: str = "vllm"
    prompts: str = "builtin"
    domains: list[str] | None = None
    max_prompts: int | None = None
    max_new_tokens: int = 64
    reference: str = "on-policy"
    seed: int = 0
    batch_size: int = 8
    batch_sizes: list[int] | None = None
    k_max: int = 8
    k: list[int] = field(default_factory=lambda: [1, 2, 4])
    adaptive_threshold: float | None = None
    verify_factor: float | None = None
    cost_ratio: float | None = None
    device: str = "auto"
    dtype: str = "auto"
    device_map: str | None = None
    max_memory: str | None = None
    force: bool = False
    no_cache: bool = False
    brief: bool = False
    shard: tuple[int, int] | None = None  # (index, count) of a sharded run
    rules: list[Path] = field(default_factory=list)
    fail_on: str = "error"
    json_path: Path | None = None
    csv_dir: Path | None = None
    html: Path | None = None
    junit: Path | None = None
    markdown: Path | None = None
    serving_config: list[Path] = field(default_factory=list)
    baseline: Path | None = None
    candidate: Path | None = None  # compare's CANDIDATE.json (not a key: a file's outputs.json)
    config: Path | None = None
    origins: Mapping[str, str] = field(default_factory=dict)

    def where(self, param: str) -> str:
        """How to name a value in an error: the flag typed, or `FILE: key`."""
        o = self.origins.get(param, "default")
        return KEY_BY_PARAM[param].flag if o == "default" else o

    def source(self, param: str) -> str:
        """A value's source in one word: the flag typed, or the file's name."""
        return self.where(param).split(": ")[0]

    def from_command_line(self, param: str) -> bool:
        return self.origins.get(param, "default") == KEY_BY_PARAM[param].flag

    def outputs(self) -> list[OutputPath]:
        return [OutputPath(self.where(p), getattr(self, p), _OUTPUT_KINDS[p]) for p in _OUTPUT_KINDS if getattr(self, p) is not None]  # type: ignore[arg-type]

    def sampling_flags(self) -> SamplingFlags:
        from specprobe.settings.pipeline import SamplingFlags

        return SamplingFlags(**{k: getattr(self, k) for k in _SAMPLING}, sampling_semantics=self.sampling_semantics)

    def sampling_origins(self) -> dict[str, str]:
        """SamplingPair.sources slot → the flag or file that set it (explicit ones only)."""
        return {SAMPLING_SLOT[k]: self.source(k) for k in _SAMPLING if getattr(self, k) is not None}

    def diagnose_config(self, **extra: Any) -> DiagnoseConfig:
        return DiagnoseConfig(
            target=self.target or "",
            drafter=self.drafter or "",
            prompts=self.prompts,
            domains=self.domains,
            max_prompts=self.max_prompts,
            max_new_tokens=self.max_new_tokens,
            reference=self.reference,
            sampling=self.sampling_flags(),
            seed=self.seed,
            batch_size=self.batch_size,
            batch_sizes=self.batch_sizes,
            k_max=self.k_max,
            verify_factor=self.verify_factor,
            cost_ratio=self.cost_ratio,
            cost_origins={p: self.source(p) for p in ("cost_ratio", "verify_factor") if getattr(self, p) is not None},
            device=self.device,
            dtype=self.dtype,
            device_map=self.device_map,
            max_memory=self.max_memory,
            rules=[str(r) for r in self.rules],
            fail_on=self.fail_on,
            force=self.force,
            use_cache=not self.no_cache,
            sampling_origins=self.sampling_origins(),
            **extra,
        )

    def simulate_config(self) -> SimulateConfig:
        return SimulateConfig(self.diagnose_config(keep_positions=False), ks=list(self.k), adaptive_threshold=self.adaptive_threshold)


# ----------------------------------------------------------------------------- the merge
def _from_cli(param: str, value: Any, where: str) -> Any:
    """A parsed flag's value in the options object's type."""
    if value is None:
        return None
    if param in _OUTPUT_KINDS:
        if not str(value).strip():
            # e.g. --markdown "$GITHUB_STEP_SUMMARY" outside CI: never "the current folder"
            raise OutputError(f"{where} was given an empty path", "give it a file name, or leave the flag out")
        return Path(value)
    if param == "domains":
        return [d.strip() for d in str(value).split(",") if d.strip()] or None
    if param == "k":
        return parse_ks(str(value), where)
    if param == "batch_sizes":
        return parse_batch_sizes(str(value), where)
    if param in ("rules", "serving_config"):
        return [Path(v) for v in value]
    if param == "max_memory":
        from specprobe.settings.values import parse_max_memory

        parse_max_memory(str(value), where)
        return str(value)
    if param == "shard":
        from specprobe.settings.values import parse_shard

        sh = parse_shard(str(value), where)
        return (sh.index, sh.count)
    return value


def merge(command: str, params: Mapping[str, Any], given: Collection[str], config: str | Path | None = None) -> RunOptions:
    """One merge for every command: `params` are the command's parsed parameters (its
    defaults included), `given` the names typed on the command line; a probe config
    fills every parameter that was not typed. Validates everything it can without
    loading a model — values, ranges, device, dtype, and every output path."""
    from specprobe.settings.config import load_probe_config

    names = {f.name for f in fields(RunOptions)}
    values: dict[str, Any] = {"candidate": params.get("candidate")}
    origins: dict[str, str] = {}
    for param, value in params.items():
        if param not in KEY_BY_PARAM:
            continue
        spec = KEY_BY_PARAM[param]
        where = spec.flag if param in given else "default"
        values[param] = _from_cli(param, value, spec.flag)
        origins[param] = where
    if config is not None:
        pc = load_probe_config(config)
        name = Path(config).name
        file_vals = pc.explicit()
        for spec in KEYS:
            if spec.key in file_vals and spec.file_applies(command) and spec.param not in given and spec.param in params:
                values[spec.param] = file_vals[spec.key] if spec.param != "shard" else _from_cli("shard", file_vals[spec.key], f"{name}: shard")
                origins[spec.param] = f"{name}: {spec.key}"
        # diagnose tabulates τ(K) for every K up to the largest one a file's k lists
        if command == DIAGNOSE and "k" in file_vals and "k_max" not in file_vals and "k_max" not in given:
            values["k_max"], origins["k_max"] = max(file_vals["k"]), f"{name}: k"
        # compare's candidate defaults to the result this config's diagnose run writes
        if command == COMPARE and values["candidate"] is None and "outputs.json" in file_vals:
            values["candidate"] = file_vals["outputs.json"]
        values["config"] = Path(config)
    for name_ in ("rules", "serving_config", "k"):
        if values.get(name_) is None:
            values.pop(name_, None)
    opts = RunOptions(command=command, **{k: v for k, v in values.items() if k in names}, origins=origins)
    validate_options(opts)
    return opts


def validate_options(o: RunOptions) -> None:
    """Every check that needs no model, each naming where the bad value came from."""

    def bad(param: str, what: str, hint: str) -> ConfigError:
        return ConfigError(f"{o.where(param)} {getattr(o, param)!r} {what}", hint)

    for p in ("temperature", "draft_temperature"):
        if getattr(o, p) is not None and getattr(o, p) < 0:
            raise bad(p, "is negative", "use 0 for greedy or a positive temperature")
    for p in ("top_p", "draft_top_p"):
        if getattr(o, p) is not None and not 0 < getattr(o, p) <= 1:
            raise bad(p, "is outside (0, 1]", "use e.g. 0.9, or 1 for off")
    for p in ("top_k", "draft_top_k"):
        if getattr(o, p) is not None and getattr(o, p) < 0:
            raise bad(p, "is negative", "use 0 for off")
    if o.min_p is not None and not 0 <= o.min_p < 1:
        raise bad("min_p", "is outside [0, 1)", "use e.g. 0.05, or 0 for off")
    if o.sampling_semantics not in SEMANTICS:
        raise bad("sampling_semantics", "is not known", f"use {', '.join(SEMANTICS)}")
    if o.fail_on not in FAIL_ON:
        raise bad("fail_on", "is not known", f"use {', '.join(FAIL_ON)}")
    if o.command in _RUNS:
        if not o.target or not o.drafter:
            also = ", or give them in a --config file"
            raise ConfigError(f"{o.command} needs a TARGET and a DRAFTER", f"e.g. specprobe {o.command} smollm2 self:layers=28{also}")
        if o.reference not in REFERENCES:
            raise bad("reference", "is not known", "use on-policy or dataset")
        for p in ("max_new_tokens", "batch_size"):
            if getattr(o, p) < 1:
                raise bad(p, "must be at least 1", "use a positive integer")
        if o.max_prompts is not None and o.max_prompts < 1:
            raise bad("max_prompts", "must be at least 1", "leave it out for every prompt")
        if not 1 <= o.k_max <= K_LIMIT:
            raise bad("k_max", "is out of range", f"use 1 ≤ K ≤ {K_LIMIT}")
        if o.command == SIMULATE:
            if not o.k or min(o.k) < 1 or max(o.k) > K_LIMIT:
                raise bad("k", f"must list draft lengths between 1 and {K_LIMIT}", "use e.g. --k 1,2,4")
            t = o.adaptive_threshold
            if t is not None and not 0.0 <= t <= 1.0:
                raise bad("adaptive_threshold", "is outside [0, 1]", "it is a drafter confidence max q; use e.g. 0.4")
        if o.verify_factor is not None and o.verify_factor <= 0:
            raise bad("verify_factor", "must be positive", "use e.g. 1.5, or leave it out to measure it on the device")
        if o.batch_sizes is not None and (not o.batch_sizes or min(o.batch_sizes) < 1):
            raise bad("batch_sizes", "must list positive batch sizes", "use e.g. --batch-sizes 1,8,32")
        if o.cost_ratio is not None and o.cost_ratio <= 0:
            raise bad("cost_ratio", "must be positive", "leave it out to measure it on the device")
    if o.command in _RUNS | {DEMO}:
        check_runtime(o.device, o.dtype, o.where("device"), o.where("dtype"))
    check_outputs(o.outputs())


def check_runtime(device: str, dtype: str, device_where: str = "--device", dtype_where: str = "--dtype") -> None:
    """Device and dtype, refused before the target loads (a big one takes minutes)."""
    if dtype not in DTYPES:
        raise ConfigError(f"{dtype_where} {dtype!r} is not supported", f"use {', '.join(DTYPES)}")
    if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ConfigError(f"{device_where} {device!r} is not supported", "use auto, cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{device_where} {device} was given but no CUDA device is available", "use --device cpu or auto")


def relabel_sources(sources: Mapping[str, str], origins: Mapping[str, str]) -> dict[str, str]:
    """effective_sampling() calls every explicit setting "flag"; name the flag or file."""
    return {slot: origins.get(slot, src) if src == "flag" else src for slot, src in sources.items()}




