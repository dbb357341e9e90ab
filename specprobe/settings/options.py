"""The settings of a run: one options object for check, diagnose, simulate, sweep,
compare, merge and demo, built by one merge — flags typed on the command line over a probe
config file over the command's defaults — and checked before any model loads or file is
written.

What each setting is (flag, probe-config key, type, bounds, commands) is the table in
`specprobe.settings.model`; this module owns the merge and the checks that involve more
than one setting. `RunOptions` then builds the pipeline's own settings (`DiagnoseConfig`,
`SimulateConfig`, in `specprobe.settings.pipeline`), which the pipeline reads and never
merges again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.core.files import InputPath, OutputPath, check_outputs
from specprobe.engines import get
from specprobe.settings.config import load_probe_config
from specprobe.settings.model import (
    BY_FILE_KEY,
    BY_NAME,
    COMPARE,
    DEMO,
    DIAGNOSE,
    OUTPUTS,
    RUNS,
    SAMPLING,
    check,
    from_text,
)
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags, SimulateConfig
from specprobe.settings.served import ServingConfig
from specprobe.settings.serving import kv_cache_setting, read_serving_config, tree_setting

# where effective_sampling() files each sampling setting: a draft_* one under "draft.", the rest under "target."
SAMPLING_SLOT = {k: ("draft." + k[len("draft_"):]) if k.startswith("draft_") else "target." + k for k in SAMPLING}


@dataclass(frozen=True)
class RunOptions:
    """Everything a command was told, merged: `values` by setting name (a setting not
    given reads as the command's default); `origins` says where each value came from: the
    flag as typed, `FILE: key`, or "default"."""

    command: str
    values: Mapping[str, Any] = field(default_factory=dict)
    origins: Mapping[str, str] = field(default_factory=dict)
    candidate: Path | None = None  # compare's CANDIDATE.json (not a key: a file's outputs.json)
    config: Path | None = None
    servings: tuple[ServingConfig, ...] = ()  # the serving configs read, in the order given
    # what each place wrote for each target-side sampling setting ("command line",
    # "probe.yaml", "sglang-launch.yaml"), for the alignment check's config-conflict rule
    declared: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        s = BY_NAME.get(name)
        if s is None or name.startswith("__"):
            raise AttributeError(name)
        value = self.__dict__["values"].get(name, s.default_for(self.__dict__["command"]))
        if value is None and s.file_type == list[Path]:
            return []  # --rules / --serving-config not given: none
        return value

    def where(self, param: str) -> str:
        """How to name a value in an error: the flag typed, or `FILE: key`."""
        o = self.origins.get(param, "default")
        return BY_NAME[param].flag if o == "default" else o

    def source(self, param: str) -> str:
        """A value's source in one word: the flag typed, or the file's name."""
        return self.where(param).split(": ")[0]

    def from_command_line(self, param: str) -> bool:
        return self.origins.get(param, "default") == BY_NAME[param].flag

    def outputs(self) -> list[OutputPath]:
        return [OutputPath(self.where(p), getattr(self, p), kind) for p, kind in OUTPUTS.items() if getattr(self, p) is not None]  # type: ignore[arg-type]

    def inputs(self) -> list[InputPath]:
        """The files the command reads (a setting that names none, as 'builtin' or '-'
        prompts, is left out): no output may be one of them."""
        found: list[InputPath] = []
        for p in ("prompts", "rules", "serving_config", "baseline"):
            value = self.values.get(p)
            for path in value if isinstance(value, (list, tuple)) else [value]:
                if path is not None and not (p == "prompts" and str(path) in ("builtin", "-")):
                    found.append(InputPath(self.where(p), Path(path)))
        if self.candidate is not None:
            found.append(InputPath(self.origins.get("candidate", "CANDIDATE.json"), Path(self.candidate)))
        if self.config is not None:
            found.append(InputPath("--config", self.config))
        return found

    def sampling_flags(self) -> SamplingFlags:
        return SamplingFlags(**{k: getattr(self, k) for k in SAMPLING}, sampling_semantics=self.sampling_semantics or get(self.engine).sampling.name)

    def sampling_origins(self) -> dict[str, str]:
        """SamplingPair.sources slot → the flag or file that set it (explicit ones only)."""
        return {SAMPLING_SLOT[k]: self.source(k) for k in SAMPLING if getattr(self, k) is not None}

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
            engine=self.engine,
            draft_sampling=self.draft_sampling,
            draft_p_min=self.draft_p_min,
            draft_n_min=self.draft_n_min,
            accept_threshold_single=self.accept_threshold_single,
            accept_threshold_acc=self.accept_threshold_acc,
            tree=self.tree,
            tree_estimate=self.tree_estimate,
            tree_paths_stride=self.tree_paths_stride,
            seed=self.seed,
            batch_size=self.batch_size,
            batch_sizes=self.batch_sizes,
            context_lengths=self.context_lengths,
            k_max=self.k_max,
            verify_factor=self.verify_factor,
            cost_ratio=self.cost_ratio,
            cost_origins={p: self.source(p) for p in ("cost_ratio", "verify_factor") if getattr(self, p) is not None},
            revision=self.revision,
            draft_revision=self.draft_revision,
            offline=self.offline,
            against=self.against,
            against_model=self.against_model,
            against_timeout=self.against_timeout,
            target_server=self.target_server,
            target_model=self.target_model,
            target_logprobs=self.target_logprobs,
            target_widen=self.target_widen,
            device=self.device,
            gguf_weights=self.gguf_weights,
            dtype=self.dtype,
            device_map=self.device_map,
            max_memory=self.max_memory,
            target_quant=self.target_quant,
            draft_quant=self.draft_quant,
            kv_cache_dtype=self.kv_cache_dtype,
            draft_kv_cache_dtype=self.draft_kv_cache_dtype,
            rules=[str(r) for r in self.rules],
            fail_on=self.fail_on,
            force=self.force,
            use_cache=not self.no_cache,
            sampling_origins=self.sampling_origins(),
            **extra,
        )

    def simulate_config(self) -> SimulateConfig:
        return SimulateConfig(self.diagnose_config(keep_positions=False), ks=list(self.k), adaptive_threshold=self.adaptive_threshold, seeds=self.seeds)


# ----------------------------------------------------------------------------- the merge
def merge(command: str, params: Mapping[str, Any], given: Collection[str], config: str | Path | None = None, inputs: Collection[InputPath] = ()) -> RunOptions:
    """One merge for every command: `params` are the command's parsed parameters (its
    defaults included), `given` the names typed on the command line; a probe config
    fills every parameter that was not typed. Every value is checked where it was
    written (the settings model); then what involves more than one setting — models,
    device, dtype, and every output path, none of which may be an input (the options'
    own, and `inputs`: files the command names in its own parameters, as report's
    RESULT.json)."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for param, value in params.items():
        if param not in BY_NAME:
            continue
        s = BY_NAME[param]
        values[param] = from_text(param, value, s.flag)
        origins[param] = s.flag if param in given else "default"
    candidate = params.get("candidate")
    if config is not None:
        pc = load_probe_config(config)  # its values are checked there, naming the file and key
        name = Path(config).name
        file_vals = pc.explicit()
        for key, value in file_vals.items():
            s = BY_FILE_KEY[key]
            if s.takes_file_key(command) and s.name not in given and s.name in params:
                where = f"{name}: {key}"
                values[s.name] = from_text(s.name, value, where) if s.parse is not None and isinstance(value, str) else value
                origins[s.name] = where
        # diagnose tabulates τ(K) for every K up to the largest one a file's k lists
        if command == DIAGNOSE and "k" in file_vals and "k_max" not in file_vals and "k_max" not in given:
            values["k_max"], origins["k_max"] = max(file_vals["k"]), f"{name}: k"
        # compare's candidate defaults to the result this config's diagnose run writes
        if command == COMPARE and candidate is None and "outputs.json" in file_vals:
            candidate = file_vals["outputs.json"]
            origins["candidate"] = f"{name}: outputs.json"
    opts = RunOptions(command=command, values=values, origins=origins, candidate=candidate, config=Path(config) if config is not None else None)
    # no output may be one of the inputs: refused before any input is read
    check_outputs(opts.outputs(), [*opts.inputs(), *inputs])
    if "serving_config" in params:
        opts = _with_servings(opts, values, origins, [read_serving_config(p) for p in values.get("serving_config") or []])
    if values.get("target_server") and values.get("target") and not values.get("drafter"):
        # --target-server URL DRAFTER: the one model given is the drafter (the target is served)
        values = {**values, "drafter": values["target"], "target": None}
        origins = {**origins, "drafter": origins.get("target", "DRAFTER")}
        opts = replace(opts, values=values, origins=origins)
    _check_together(opts)
    return opts


def _with_servings(opts: RunOptions, values: dict[str, Any], origins: dict[str, str], servings: list[ServingConfig]) -> RunOptions:
    """What the serving configs fill: a setting neither typed nor in the probe config
    (flags > probe config > serving configs > defaults) takes the serving config's value,
    its origin `FILE: key`. Sampling, target and drafter from the first config that sets
    them; the engine and its drafting from the configs, which must agree."""

    def unset(p: str) -> bool:
        return p in values and origins.get(p, "default") == "default"

    if unset("engine"):
        engines = {sv.engine for sv in servings}
        if len(engines) > 1:
            said = ", ".join(f"{sv.source.name} runs {get(sv.engine).label}" for sv in servings)
            raise ConfigError(f"the serving configs disagree on the engine ({said})", "say which to predict for with --engine (or engine: in the probe config)")
        if engines:
            values["engine"], origins["engine"] = servings[0].engine, servings[0].where("engine")
    if unset("draft_sampling"):
        # a config's drafting is its own engine's: it says nothing of another engine's
        mine = [sv for sv in servings if sv.drafting and sv.engine == values.get("engine")]
        if len({sv.drafting for sv in mine}) > 1:
            said = ", ".join(f"{sv.where('drafting')} {sv.drafting}" for sv in mine)
            raise ConfigError(f"the serving configs disagree on the drafting ({said})", "say which with --draft-sampling (or draft_sampling: in the probe config)")
        if mine:
            values["draft_sampling"], origins["draft_sampling"] = mine[0].drafting, mine[0].where("drafting")
    filled: set[str] = set()
    for p in SAMPLING:
        if not unset(p):
            continue
        base = p[len("draft_") :] if p.startswith("draft_") else p
        for sv in servings:
            found = sv.draft_sampling if p.startswith("draft_") else sv.sampling
            if base in found:
                values[p] = int(found[base]) if base == "top_k" else found[base]
                origins[p] = sv.where(p)
                filled.add(p)
                break
    engine = values.get("engine")
    for p, knob in (get(engine).serving_knobs if isinstance(engine, str) else {}).items():
        # the engine's own knobs (llama-server's early stop, SGLang's thresholds), for a run that predicts that engine
        if unset(p):
            sv_knob = next((sv for sv in servings if sv.engine == engine and sv.extra.get(knob) is not None), None)
            if sv_knob is not None:
                values[p], origins[p] = sv_knob.extra[knob], sv_knob.where(knob)
    for p in ("kv_cache_dtype", "draft_kv_cache_dtype"):
        # the engine's KV-cache dtype, target side and the drafter's own (vLLM's
        # speculative_config.kv_cache_dtype, SGLang's --speculative-draft-kv-cache-dtype)
        sv_kv = next((sv for sv in servings if getattr(sv, p) is not None), None)
        if unset(p) and sv_kv is not None:
            values[p], origins[p] = kv_cache_setting(str(getattr(sv_kv, p)), sv_kv.where(p), sv_kv.engine), sv_kv.where(p)
    if unset("tree") and isinstance(engine, str) and get(engine).verifies_trees:
        # the tree an SGLang launch or a TensorRT-LLM decoding config verifies
        trees = [t for t in (tree_setting(sv) for sv in servings if sv.engine == values.get("engine")) if t is not None]
        if trees:
            values["tree"], origins["tree"] = trees[0]
    for p, of in (("target", lambda sv: sv.target), ("drafter", lambda sv: sv.drafter_spec)):
        if p in values and values[p] is None:
            first = next((sv for sv in servings if of(sv)), None)
            if first is not None:
                values[p], origins[p] = of(first), first.where(p)
    declared: dict[str, dict[str, float]] = {}
    for p in SAMPLING:
        if not p.startswith("draft_") and p not in filled and values.get(p) is not None and origins.get(p, "default") != "default":
            place = COMMAND_LINE if origins[p] == BY_NAME[p].flag else origins[p].split(": ")[0]
            declared.setdefault(place, {})[p] = float(values[p])
    for sv in servings:
        # what the file writes; an engine's own default (llama-server's sampler) is replaced
        # by a request's value, so it conflicts with nothing
        written = {k: v for k, v in sv.sampling.items() if not sv.is_default(k)}
        if written:
            declared.setdefault(sv.source.name, {}).update(written)
    return replace(opts, values=values, origins=origins, servings=tuple(servings), declared=declared)


COMMAND_LINE = "command line"  # how `declared` names the flags typed


def _check_together(o: RunOptions) -> None:
    """What no single setting's bounds can say: a run needs both models and a CUDA device must exist."""
    if o.command in RUNS and o.target_server and not o.drafter:
        raise ConfigError(f"{o.command} --target-server needs a DRAFTER", f"e.g. specprobe {o.command} --target-server http://127.0.0.1:8000 ./drafter")
    if o.command in RUNS and not o.target_server and (not o.target or not o.drafter):
        raise ConfigError(f"{o.command} needs a TARGET and a DRAFTER", f"e.g. specprobe {o.command} smollm2 self:layers=28, or give them in a --config file or a --serving-config")
    if o.command in RUNS | {DEMO}:
        check_runtime(o.device, o.dtype, o.where("device"), o.where("dtype"))


def check_runtime(device: str, dtype: str, device_where: str = "--device", dtype_where: str = "--dtype") -> None:
    """Device and dtype, refused before the target loads (a big one takes minutes)."""
    check("dtype", dtype, dtype_where)
    if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ConfigError(f"{device_where} {device!r} is not supported", "use auto, cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{device_where} {device} was given but no CUDA device is available", "use --device cpu or auto")


def relabel_sources(sources: Mapping[str, str], origins: Mapping[str, str]) -> dict[str, str]:
    """effective_sampling() calls every explicit setting "flag"; name the flag or file."""
    return {slot: origins.get(slot, src) if src == "flag" else src for slot, src in sources.items()}




