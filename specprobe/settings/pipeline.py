"""The pipeline's own settings: `DiagnoseConfig` (what `diagnose` runs with, and what its
result records) and `SimulateConfig` (diagnose's settings plus the draft→verify loop's).

A command builds them from its merged options (`specprobe.settings.options.RunOptions`); the
pipeline reads them and never merges again. `DEFAULT_CHUNK_POSITIONS` (the metrics'
chunk size) lives here with them. A config built in code is held to the settings
model's bounds as a merged one is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.engines import DEFAULT, DEFAULT_SEMANTICS, ENGINES, GREEDY, get
from specprobe.estimates.tree import TreeShape
from specprobe.estimates.tree import parse as parse_tree_text
from specprobe.settings.model import BY_NAME, SAMPLING, check

# Positions per metrics chunk: small enough that the four [chunk, V] float32 scratch
# buffers stay warm in cache (measured best at 32–64 on a 2-core CPU with V = 49,152).
DEFAULT_CHUNK_POSITIONS = 64


@dataclass(frozen=True)
class SamplingFlags:
    """Sampling settings from the command line or a serving config; None means 'not
    given'. The draft_* fields set the drafter apart from the target (engines share one
    set of sampling parameters otherwise)."""

    temperature: float | None = None
    draft_temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    draft_top_k: int | None = None
    draft_top_p: float | None = None
    sampling_semantics: str = DEFAULT_SEMANTICS  # whose transform (`engines.SEMANTICS`)
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DiagnoseConfig:
    """What `diagnose` runs with; `to_dict()` is the config its result records."""

    target: str
    drafter: str
    prompts: str = "builtin"
    domains: list[str] | None = None
    max_prompts: int | None = None
    max_new_tokens: int = 64
    reference: str = "on-policy"  # or "dataset"
    sampling: SamplingFlags = field(default_factory=SamplingFlags)
    engine: str = DEFAULT  # whose draft-and-verify procedure the estimates follow
    draft_sampling: str | None = None  # None: the engine's own drafting
    draft_p_min: float = 0.0  # the engine's early stop (`Engine.draft_stops`: --spec-draft-p-min); 0: off
    draft_n_min: int = 0  # the engine's shortest draft (--spec-draft-n-min); 0: off
    accept_threshold_single: float = 1.0  # SGLang's relaxed acceptance; 1: exact
    accept_threshold_acc: float = 1.0
    # a draft tree (`estimates.tree`): SGLang's "steps=S,topk=T,tokens=N" or static rank
    # paths as JSON; None: a chain of K = 1..k_max
    tree: str | None = None
    tree_estimate: str = "paths"  # the run's own tree: drafted on its candidate paths, or along the reference as the grid
    tree_paths_stride: int | None = None  # paths: draft every N-th start (None: about PATHS_STARTS starts in all)
    seed: int = 0
    batch_size: int = 8
    batch_sizes: list[int] | None = None  # also time costs at these (the run's batch size always)
    context_lengths: list[int] | None = None  # also score prompts built to these token lengths (probe.long_context)
    k_max: int = 8
    verify_factor: float | None = None  # None: measure v_K on the device
    cost_ratio: float | None = None  # None: measure on the device
    # a repo id's revision on the Hugging Face hub (None: main; recorded only when given) and
    # whether downloads are off (--offline; not recorded: it changes nothing measured)
    revision: str | None = None
    draft_revision: str | None = None
    # diagnose --against: a live server of the engine to compare the prediction with
    against: str | None = None
    against_model: str | None = None
    against_timeout: float = 900.0
    # diagnose --target-server: the target is an engine's server, scored from its prompt logprobs
    target_server: str | None = None
    target_model: str | None = None
    target_logprobs: int = 20
    target_widen: int = 0  # a second, wider top-n for the prompts with loose positions (0: off)
    offline: bool = False
    device: str = "auto"
    gguf_weights: str = "auto"  # a quantized GGUF: held as its blocks, the fp32 path, or auto (held when fp32 would not fit)
    dtype: str = "auto"
    rules: list[str] = field(default_factory=list)
    fail_on: str = "error"
    force: bool = False
    use_cache: bool = True
    chunk_positions: int = DEFAULT_CHUNK_POSITIONS
    keep_positions: bool = True
    # one shard (index, count) of a sharded run: --shard I/N, or this rank of torchrun;
    # its part (specprobe.probe.shards) is also written to part_path when given. Not recorded:
    # every shard of a run records the same settings
    shard: tuple[int, int] | None = None
    part_path: str | None = None
    # a target larger than one device: accelerate's device_map ("auto", "balanced", …) and
    # the memory per device ("0=70GiB,1=70GiB"); recorded only when given
    device_map: str | None = None
    max_memory: str | None = None
    # the weights as served: RTN-quantized after loading (specprobe.precision.quant); recorded only when given
    target_quant: str | None = None
    draft_quant: str | None = None
    kv_cache_dtype: str | None = None  # "fp8": K/V rounded to e4m3 on both sides (specprobe.precision.quant)
    draft_kv_cache_dtype: str | None = None  # the drafter's own; None: kv_cache_dtype
    # where each explicit sampling setting came from ("--temperature", "probe.yaml"),
    # by SamplingPair.sources slot; not part of the recorded config
    sampling_origins: dict[str, str] = field(default_factory=dict)
    # where a given cost_ratio / verify_factor came from ("--cost-ratio", "probe.yaml"); not recorded
    cost_origins: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a config built in code (not by the options merge) is held to the same bounds
        for name in ("max_new_tokens", "batch_size", "k_max", "max_prompts", "verify_factor", "cost_ratio", "batch_sizes", "reference", "dtype", "fail_on", "engine", "draft_sampling", "target_quant", "draft_quant", "kv_cache_dtype", "draft_kv_cache_dtype"):
            check(name, getattr(self, name), BY_NAME[name].flag)
        for name in SAMPLING:
            check(name, getattr(self.sampling, name), BY_NAME[name].flag)
        engine = get(self.engine)
        for name in ("draft_p_min", "draft_n_min"):
            value = check(name, getattr(self, name), BY_NAME[name].flag)
            if value and not engine.draft_stops:
                owner = next(e for e in ENGINES if e.draft_stops)
                raise ConfigError(
                    f"{BY_NAME[name].flag} is {owner.label}'s (--spec-{name.replace('_', '-')}); {engine.label} drafts K tokens every round",
                    f"add --engine {owner.name}, or leave {BY_NAME[name].flag} out",
                )
        if self.draft_n_min > self.k_max:
            raise ConfigError(f"--draft-n-min {self.draft_n_min} is more than --k-max {self.k_max}: every draft would be dropped", "use --draft-n-min at most the longest draft, or raise --k-max")
        for name in ("accept_threshold_single", "accept_threshold_acc"):
            value = check(name, getattr(self, name), BY_NAME[name].flag)
            if value < 1 and not engine.relaxed_thresholds:
                owner = next(e for e in ENGINES if e.relaxed_thresholds)
                raise ConfigError(
                    f"{BY_NAME[name].flag} is {owner.label}'s (--speculative-{name.replace('_', '-')}); {engine.label} verifies every draft exactly",
                    f"add --engine {owner.name}, or leave {BY_NAME[name].flag} out",
                )
        if min(self.thresholds) < 1 and str(self.drafter).split(":", 1)[0] == "sglang-ngram":
            raise ConfigError("--accept-threshold-single/-acc below 1 with sglang-ngram is not modelled (its padded tree is verified exactly here)",
                              "leave the thresholds at 1 for an NGRAM drafter, or estimate a model drafter with them")

        if self.tree is not None:
            self._check_tree()

    def _check_tree(self) -> None:
        shape = self.tree_shape
        assert shape is not None
        if not get(self.engine).verifies_trees:
            tree_engines = [e.name for e in ENGINES if e.verifies_trees]
            raise ConfigError(
                f"--tree: {get(self.engine).label} verifies chains, not trees",
                f"add --engine {tree_engines[0]} (or {' or '.join(tree_engines[1:])}) for the engine that verifies this tree, or leave --tree out",
            )
        if shape.steps > self.k_max:
            raise ConfigError(f"--tree steps={shape.steps} is deeper than --k-max {self.k_max}", f"raise --k-max to at least {shape.steps}")
        if self.drafting != GREEDY:
            raise ConfigError("--tree drafts each step's top candidates (greedy drafting); --draft-sampling probabilistic has no tree",
                              "leave --draft-sampling out for a tree")

    @property
    def tree_shape(self) -> TreeShape | None:
        """The draft tree the run estimates, or None for a chain."""
        return None if self.tree is None else parse_tree_text(self.tree)

    @property
    def kv_fp8(self) -> tuple[bool, bool]:
        """(target, drafter): whether each side's KV cache is fp8."""
        draft = self.draft_kv_cache_dtype or self.kv_cache_dtype
        return (self.kv_cache_dtype == "fp8", draft == "fp8")

    @property
    def kv_served(self) -> tuple[str | None, str | None]:
        """(target, drafter): each side's KV-cache dtype to simulate, None for the compute
        dtype (auto; f32, which a float32 run already holds)."""
        draft = self.draft_kv_cache_dtype or self.kv_cache_dtype

        def served(d: str | None) -> str | None:
            return None if d in (None, "auto", "f32", "f32/f32") else d

        return (served(self.kv_cache_dtype), served(draft))

    @property
    def thresholds(self) -> tuple[float, float]:
        """SGLang's (threshold_single, threshold_acc); (1, 1): exact verification."""
        return (self.accept_threshold_single, self.accept_threshold_acc)

    @property
    def lossy(self) -> bool:
        """Whether the verification accepts drafts the target would not sample (SGLang's thresholds below 1)."""
        return get(self.engine).relaxed_thresholds and self.drafting == GREEDY and min(self.thresholds) < 1

    @property
    def confidence(self) -> int:
        """Whose drafter confidence the adaptive K and --draft-p-min read
        (`Engine.confidence_top_n`: 0 max q, N the draft sampler's top of N)."""
        return get(self.engine).confidence_top_n

    @property
    def drafting(self) -> str:
        """greedy | probabilistic: --draft-sampling, else the engine's own."""
        return get(self.engine).drafting(self.draft_sampling)

    def cost_batch_sizes(self) -> list[int]:
        """The batch sizes costs are timed at: --batch-sizes and the run's own."""
        return sorted({self.batch_size, *(self.batch_sizes or [])})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("sampling_origins")
        d.pop("cost_origins")
        d.pop("shard")
        d.pop("part_path")
        d.pop("offline")
        if d["against"] is None:  # recorded only when a server was compared with
            for k in ("against", "against_model", "against_timeout"):
                d.pop(k)
        if d["target_server"] is None:  # recorded only when the target was served
            for k in ("target_server", "target_model", "target_logprobs", "target_widen"):
                d.pop(k)
        for k in ("revision", "draft_revision", "device_map", "max_memory", "target_quant", "draft_quant", "kv_cache_dtype", "draft_kv_cache_dtype"):
            if d[k] is None:
                d.pop(k)
        d.update(d.pop("sampling"))
        d["draft_sampling"] = self.drafting  # the procedure the numbers follow, resolved
        return d


@dataclass
class SimulateConfig:
    """`simulate` = `diagnose`'s settings (the estimate on the same prompts) + the loop's."""

    diagnose: DiagnoseConfig
    ks: list[int] = field(default_factory=lambda: [1, 2, 4])
    adaptive_threshold: float | None = None
    baseline: bool = True  # also time plain target decoding (the speedup's denominator)
    seeds: int = 1  # the loop under seeds seed, seed + 1, …, pooled

    def __post_init__(self) -> None:
        if not self.ks:
            raise ConfigError("--k lists no draft length", "use e.g. --k 1,2,4")
        check("k", list(self.ks), "--k")
        check("adaptive_threshold", self.adaptive_threshold, "--adaptive-threshold")
        check("seeds", self.seeds, "--seeds")

    def to_dict(self) -> dict[str, Any]:
        d = self.diagnose.to_dict()
        d.update({"k": list(self.ks), "adaptive_threshold": self.adaptive_threshold, "seeds": self.seeds})
        return d
