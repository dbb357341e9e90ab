"""The result of a check, diagnose or simulate run and its sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from specprobe.result.base import (
    SCHEMA_VERSION,
    Document,
    Evaluation,
    Finding,
    Metrics,
    Num,
    Part,
    Record,
    Severity,
    Value,
    catalogue_names,
)
from specprobe.result.drill import DrillDown

# ----------------------------------------------------------------------------- run header
# The headline of a result that scored no position: no rule but the alignment ones can judge it.
NOTHING_SCORED = "no positions were scored — nothing to judge"

class RunConfig(Record):
    """The settings the run used (flags and config file merged). Every key is optional:
    `check` records only the ones it takes."""

    target: str | None = None
    drafter: str | None = None
    prompts: str | None = None
    domains: list[str] | None = None
    max_prompts: int | None = None
    max_new_tokens: int | None = None
    reference: str | None = None
    seed: int | None = None
    batch_size: int | None = None
    batch_sizes: list[int] | None = None
    k_max: int | None = None
    verify_factor: float | None = None
    cost_ratio: float | None = None
    device: str | None = None
    dtype: str | None = None
    rules: list[str] = Field(default_factory=list)
    fail_on: str | None = None
    force: bool | None = None
    use_cache: bool | None = None
    chunk_positions: int | None = None
    keep_positions: bool | None = None
    temperature: float | None = None
    draft_temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    draft_top_k: int | None = None
    draft_top_p: float | None = None
    # simulate only
    k: list[int] | None = None
    adaptive_threshold: float | None = None
    seeds: int | None = None

    @model_serializer(mode="wrap")
    def _only_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Written back as given: a command's config lists the settings it has, no more.
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}


class Environment(Record):
    device: str
    dtype: str
    torch: str | None = None
    transformers: str | None = None
    python: str
    platform: str
    packages: dict[str, str | None] = Field(default_factory=dict)


class Served(Part):
    """How a side was served when not as loaded: its weights quantized round-to-nearest
    after loading (a simulation, not the calibrated checkpoint), its KV cache in fp8."""

    weights: str | None = Field(None, description="fp8 | fp8:per-tensor | fp8-dynamic | int8 | w8a8-int8 | int4 (a checkpoint from disk: its bit width); null: as loaded")
    activations: str | None = Field(None, description="W8A8: how the linear layers' input activations are quantized ('fp8 dynamic per token', 'int8 static per tensor', …); null: the compute dtype")
    method: str = "rtn"
    layers: int = Field(0, description="linear layers quantized (the decoder layers'; not the embeddings or LM head)")
    weight_rel_error: float | None = Field(None, description="‖W_q − W‖ / ‖W‖ over the quantized weights")
    shared_with_target: bool = Field(False, description="a self-draft: the target's own quantized weights")
    kv_cache_dtype: str | None = Field(None, description="fp8: keys and values rounded to e4m3 (scales 1.0) as the attention reads them; a ggml type or K/V pair (q8_0, q4_0/f16, f16, …): rounded as llama.cpp's cache stores them; null: the compute dtype")
    note: str = ""


class _Side(Part):
    """Target and Drafter: `quant` is written only for a side served quantized. The field
    is each subclass's own (declared here, pydantic would write it first)."""

    @model_serializer(mode="wrap")
    def _only_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        d = handler(self)
        return d if getattr(self, "quant", None) is not None else {k: v for k, v in d.items() if k != "quant"}


class Target(_Side):
    spec: str
    name: str | None = None
    num_layers: int | None = None
    vocab_size: int | None = None
    params: int | None = None
    quant: Served | None = None


class Drafter(_Side):
    spec: str
    kind: str | None = None
    name: str | None = None
    num_layers: int | None = None
    params: int | None = None
    quant: Served | None = None


class PromptSetInfo(Part):
    name: str
    source: str
    sha256: str
    num_prompts: int
    domains: list[str]


class SamplingSide(Record):
    """One side's effective sampling settings (temperature 0 = greedy)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    semantics: str | None = None  # whose transform: vllm | sglang | transformers

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


class SamplingInfo(Record):
    target: SamplingSide
    draft: SamplingSide
    sources: dict[str, str] = Field(default_factory=dict, description="Where each setting came from: flag, generation_config, default, target's.")


class Procedure(Part):
    """The draft-and-verify procedure the estimates follow: how the engine drafts and what
    one draft token's acceptance is. τ, speedups, best K, adaptive K and the acceptance
    rate follow it; accept_prob_mean stays Σ min(p, q), the alignment measure."""

    engine: str | None = Field(default=None, description="--engine (vllm, sglang, llama.cpp, trtllm, transformers); null in results written before specprobe followed an engine.")
    engine_label: str | None = None
    drafting: Literal["greedy", "probabilistic"] = Field(description="greedy: the drafter's argmax is the draft; probabilistic: the draft is sampled from q.")
    acceptance: str = Field(description="One draft token's acceptance: p_target(draft token) (greedy drafts) or Σ min(p, q) (sampled drafts).")
    description: str = Field(description="The procedure in words, as the headline shows it.")
    adaptive_knob: str | None = Field(default=None, description="The engine's own flag for the adaptive-K threshold (llama.cpp: --spec-draft-p-min), when it has one.")


class SideFacts(Record):
    name: str | None = None
    vocab: int | None = None
    tokenizer: int | None = None
    context: int | None = None
    sampling: str | None = None


class AlignmentFacts(Record):
    target: SideFacts
    drafter: SideFacts
    sampling_sources: dict[str, str] = Field(default_factory=dict)
    sampling_semantics: str | None = None
    drafter_own_sampling: dict[str, float] | None = None


class Alignment(Part):
    facts: AlignmentFacts
    evidence: dict[str, list[str]] = Field(default_factory=dict, description="Metric name → lines that show where its value came from.")


# ----------------------------------------------------------------------------- estimate tables
class DomainRow(Part):
    """Means over the positions of one domain."""

    group: str
    positions: int
    accept_prob_mean: Num = None
    accept_prob_engine_mean: Num = None
    greedy_agree_frac: Num = None
    kl_target_draft_nats: Num = None
    target_entropy_nats: Num = None
    draft_confidence_mean: Num = None
    tv_mean: Num = None
    ngram_proposal_frac: Num = Field(default=None, description="n-gram drafters: verify steps that proposed any token ÷ all.")
    ngram_draft_tokens_mean: Num = Field(default=None, description="n-gram drafters: tokens per proposal.")
    tau_tokens: Num = Field(default=None, description="n-gram drafters: tokens per verify step in this group, walked along its references.")
    speedup: Num = Field(default=None, description="n-gram drafters: this group's tokens over the cost of its steps (verify passes and matching).")


class LengthRow(Part):
    """One domain (or 'all') at one context length (diagnose --context-lengths)."""

    domain: str
    context_tokens: int = Field(description="The prompts' token length (chat template included).")
    prompts: int
    positions: int
    accept_prob_mean: Num = Field(default=None, description="α = Σ min(p, q) over the answers at this length.")
    accept_prob_engine_mean: Num = Field(default=None, description="One draft token's acceptance under the engine's procedure.")
    k: int = Field(description="The K τ is read at: the run's best K (k_max when none).")
    tau_tokens: Num = Field(default=None, description="Renewal τ(K) at this length.")
    decay: Num = Field(default=None, description="α here ÷ α at the shortest length, within the domain.")
    cost_ratio: Num = Field(default=None, description="The drafter/target cost ratio at this length's context (the run's batch size).")
    round_cost: Num = Field(default=None, description="A round's cost at K, in target decode steps, from the costs timed at this length's context.")
    speedup: Num = Field(default=None, description="τ(K) here ÷ this length's round cost at K.")
    best_k: int | None = Field(default=None, description="The K with the best speedup at this length, under its own costs.")
    speedup_best: Num = Field(default=None, description="The speedup at best_k.")
    costs_source: str | None = Field(default=None, description="Where this length's costs came from: timed at its own context, or the run's costs where the cap or the memory left it untimed.")


class BucketRow(Part):
    """Means over the positions of one bucket [lo, hi) of target entropy or context position."""

    group: str
    lo: Value
    hi: Value = None  # None: open-ended
    positions: int
    accept_prob_mean: Num = None
    accept_prob_engine_mean: Num = None
    greedy_agree_frac: Num = None
    kl_target_draft_nats: Num = None
    target_entropy_nats: Num = None
    draft_confidence_mean: Num = None
    tv_mean: Num = None


class Histogram(Part):
    edges: list[Num] = Field(description="len(counts) + 1 bin edges; a null last edge is +∞.")
    counts: list[int]


class Histograms(Part):
    accept_prob: Histogram | None = None
    kl_target_draft_nats: Histogram | None = None


class Depth(Part):
    """Acceptance by draft depth (from 1): cumulative r_j and conditional a_j = r_j / r_(j−1)."""

    depth: list[int]
    cumulative: list[Num]
    conditional: list[Num]
    source: Literal["estimate", "measured"] = "estimate"
    head_depths: list[int] = Field(default_factory=list, description="Depths a head drafter predicted directly (others chain depth 1).")
    cumulative_se: list[Num] = Field(default_factory=list, description="Standard error of each cumulative r_j over prompts (prompts the independent units); empty in results written before it was kept.")
    thin: list[bool] = Field(default_factory=list, description="Depths whose evidence is too thin to read (too few prompts or drafts reach them, or the standard error is as large as the rate itself): reports grey them out.")


class KRow(Part):
    """One draft length K. tau_tokens/accept_rate: the window estimate (every start
    position); *_renewal: rounds start where the previous one ended, as in a real loop;
    speedup uses the renewal τ when known (speedup_window: from the window τ)."""

    k: int
    tau_tokens: Num
    accept_rate: Num
    iid_tau_tokens: Num
    speedup: Num
    tau_renewal_tokens: Num = None
    accept_rate_renewal: Num = None
    speedup_window: Num = None
    verify_factor: Num = None
    speedup_low: Num = None
    speedup_high: Num = None
    speedup_budget: Num = Field(default=None, description="Speedup on these prompts at this token budget, the final short rounds included (renewal counts): what simulate measures; speedup is the steady state.")
    accept_rate_renewal_se: Num = Field(default=None, description="Standard error of accept_rate_renewal over prompts (prompts the independent units; a ratio estimator's linearised variance, as a bootstrap over prompts approximates it).")
    tau_renewal_se: Num = Field(default=None, description="Standard error of tau_renewal_tokens over prompts: accept_rate_renewal_se × the mean draft length.")
    speedup_se: Num = Field(default=None, description="Standard error of speedup over prompts (the τ it comes from; the verify cost's own timing spread is speedup_low–speedup_high).")
    per_position_renewal: list[Num] = Field(default_factory=list, description="Per draft position i = 1..K, the rounds that accept positions 1..i ÷ the rounds that drafted position i (renewal counts: rounds start where the previous one ended; a round cut short at the end of a reference drafts fewer). A server that drafts K every round counts this as accepted at position i ÷ drafts (vLLM's spec_decode_num_accepted_tokens_per_pos ÷ spec_decode_num_drafts): the figure to set beside a server's. depth.cumulative counts every start position instead, and reads higher where a rejection is followed by harder text.")
    per_position_renewal_se: list[Num] = Field(default_factory=list, description="Standard errors of per_position_renewal over prompts.")


class Adaptive(Part):
    threshold: Num
    tau_tokens: Num
    speedup: Num
    mean_k: Num
    beats_fixed: bool | None = Field(default=None, description="Whether the best threshold's speedup beats the best fixed K's; when it does not, the recommendation is the fixed K (null in results written before this was judged).")


class Timing(Part):
    """One timed call over the interleaved repeats, in milliseconds."""

    median_ms: Num
    q1_ms: Num = None
    q3_ms: Num = None
    min_ms: Num = None
    max_ms: Num = None
    repeats: int = 0


class CostK(Part):
    """One K at one batch size: a round's cost in target decode steps (drafting K tokens +
    verifying K + 1), its quartiles over the repeats, and the speedup it gives."""

    k: int
    tau_tokens: Num = Field(description="The τ(K) used: renewal estimate, else window.")
    verify_factor: Num = Field(description="v_K: target pass over K + 1 tokens ÷ one decode step (median over repeats of the timings made non-decreasing in K, or --verify-factor).")
    verify_factor_raw: Num = Field(default=None, description="v_K's median over the repeats as timed, before the fit that makes it non-decreasing in K (null: given, or not measured).")
    round_cost: Num
    round_cost_q1: Num = None
    round_cost_q3: Num = None
    speedup: Num
    speedup_low: Num = Field(default=None, description="τ over the round cost's third quartile.")
    speedup_high: Num = Field(default=None, description="τ over the round cost's first quartile.")
    verify: Timing | None = None


class TreeVerifyCost(Part):
    """The target's pass over N tree tokens (the root included) under a tree attention
    mask ÷ its one-token decode step, at one batch size."""

    tokens: int
    verify_factor: Num = Field(description="v_N: median over the repeats where measured; else interpolated from the measured N (the chain's verify factors where none was).")
    verify_factor_q1: Num = None
    verify_factor_q3: Num = None
    measured: bool = Field(default=False, description="Whether this N was timed (false: the cap came first, or interpolated).")
    timing: Timing | None = None


class DraftWidthCost(Part):
    """The drafter's pass over T tokens (a tree step's T beams) ÷ its one-token step."""

    width: int
    width_factor: Num = Field(description="w_T: median over the repeats where measured; 1 at T = 1; else interpolated from the measured T (1 where none was).")
    width_factor_q1: Num = None
    width_factor_q3: Num = None
    measured: bool = False
    timing: Timing | None = None


class BatchCost(Part):
    """Costs and estimated speedups at one batch size (--batch-sizes)."""

    batch_size: int
    repeats: int = 0
    target_step: Timing | None = None
    draft_step: Timing | None = None
    cost_ratio: Num = None
    cost_ratio_q1: Num = None
    cost_ratio_q3: Num = None
    best_k: int | None = None
    best_k_equivalent: list[int] = Field(default_factory=list, description="The Ks whose speedup ranges overlap the fastest K's at this batch size (best_k is the smallest of them); empty when the fastest K stands apart or the costs were given.")
    speedup_best: Num = None
    rows: list[CostK] = Field(default_factory=list)
    draft_ratios: list[Num] = Field(default_factory=list, description="Drafter step ÷ target step, repeat by repeat.")
    verify_ratios: list[list[Num]] = Field(default_factory=list, description="Per K (from 1): target pass over K + 1 tokens ÷ target step, repeat by repeat.")
    context_tokens: int | None = Field(default=None, description="KV-cache length this batch size was timed over (shorter than the cost's context_tokens where its rows would not fit the memory the scoring used).")
    skipped: str | None = Field(default=None, description="Why this batch size was not timed (the cap, or the memory), when it was not.")
    tree_verify: list[TreeVerifyCost] = Field(default_factory=list, description="A tree run: v_N for the grid of tree token counts N timed.")
    draft_width: list[DraftWidthCost] = Field(default_factory=list, description="A tree run: w_T for the beam widths T timed.")


class LengthCost(Part):
    """--context-lengths: the costs timed at one prompt length's own context."""

    length: int = Field(description="The prompt length (tokens).")
    batch_size: int
    context_tokens: int | None = Field(default=None, description="KV-cache length timed over: the length + half the continuation (less where the memory cut it).")
    repeats: int = 0
    target_step: Timing | None = None
    draft_step: Timing | None = None
    cost_ratio: Num = None
    verify_factors: list[Num] = Field(default_factory=list, description="v_K, K = 1.., at this context.")
    round_costs: list[Num] = Field(default_factory=list, description="A round's cost per K, in target decode steps, at this context.")
    source: str | None = None
    skipped: str | None = None


class Cost(Part):
    """What a round costs. cost_ratio/target_step_ms/draft_step_ms: at the run's batch size
    (the headline); batches: every batch size timed. verify_factor: the value given
    (--verify-factor), null when v is measured per K."""

    cost_ratio: Num
    target_step_ms: Num = None
    draft_step_ms: Num = None
    measured: bool = False
    verify_factor: Num = None
    sources: dict[str, str] = Field(default_factory=dict, description="Where c and v came from: measured, or the flag / config key that gave them.")
    batch_size: int | None = None
    context_tokens: int | None = Field(default=None, description="KV-cache length the timings ran over: the prompts' median length + half the continuation.")
    budget_s: Num = Field(default=None, description="Time the cost measurement aimed at: half the scoring time.")
    cap_s: Num = Field(default=None, description="Time it may not pass (beyond the one call under way): half the scoring time, so a run that times its costs takes at most 1.5× one given them.")
    elapsed_s: Num = None
    stopped_by_budget: bool = False
    spread_rel: Num = Field(default=None, description="(q3 − q1) ÷ median of the round cost at the best K, at the run's batch size.")
    best_k_equivalent: list[int] = Field(default_factory=list, description="At the run's batch size, the Ks the cost timing cannot tell apart: the fastest K and every K whose speedup range overlaps its own. The recommended best K is the smallest ('K = 1–2 equivalent'); empty when the fastest K stands apart or the costs were given.")
    repeats: int | None = Field(default=None, description="Interleaved repeats the headline costs rest on (at the run's batch size); fewer than 5 when the budget cut the timing short.")
    method: str | None = Field(default=None, description="How the costs were measured: the KV caches (one prefill, copied to each batch size) and the timed passes.")
    prefill_tokens: int | None = Field(default=None, description="Tokens prefilled once per model at batch 1; every timed cache is copied from it.")
    memory_bytes: Num = Field(default=None, description="Bytes the timed caches were allowed to add: 1.4 × the peak memory before the cost step, less what it held then.")
    skipped: list[str] = Field(default_factory=list, description="What was not timed and why (a batch size past the cap or the memory).")
    batches: list[BatchCost] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    by_length: list[LengthCost] = Field(default_factory=list, description="--context-lengths: the costs at each prompt length's own context, within the same cap.")
    tree_mask: str | None = Field(default=None, description="A tree run: how the tree's verify pass was masked when timed (null: no tree timed).")
    tree_verify: list[TreeVerifyCost] = Field(default_factory=list, description="A tree run, at the run's batch size: v_N, the target's pass over N tree tokens ÷ one decode step; a tree round costs c·(1 + (S − 1)·w_T) + v_N.")
    draft_width: list[DraftWidthCost] = Field(default_factory=list, description="A tree run, at the run's batch size: w_T, the drafter's pass over T beams ÷ its one-token step.")


class Positions(Part):
    """Per-position rows (diagnose --csv positions.csv), all columns the same length
    (accept_prob_greedy_draft is empty in results written before it existed)."""

    prompt_id: list[str]
    domain: list[str]
    position: list[int]
    accept_prob: list[Num]
    accept_prob_greedy_draft: list[Num] = Field(default_factory=list, description="p_target(argmax q): the acceptance of a greedy draft at each position.")
    greedy_agree: list[Num]
    kl_target_draft_nats: list[Num]
    target_entropy_nats: list[Num]
    draft_confidence: list[Num]

    def columns(self) -> dict[str, list[Any]]:
        cols = {name: getattr(self, name) for name in type(self).model_fields}
        return {k: v for k, v in cols.items() if v or not self.position}


# ----------------------------------------------------------------------------- measured (simulate)
class MeasuredRow(Part):
    k: int
    tau_tokens: Num
    tokens_per_verify: Num
    accept_rate: Num
    speedup: Num
    tokens_per_s: Num
    num_drafts: int
    draft_ms_per_step: Num
    target_ms_per_step: Num
    tau_estimate: Num = Field(description="Estimated τ(K): the renewal estimate (window when unknown).")
    tau_gap: Num
    tau_window: Num = None
    speedup_estimate: Num = None
    speedup_gap: Num = Field(default=None, description="(estimated − measured speedup) ÷ measured.")
    emitted_tokens: int
    wall_s: Num
    prompts: int
    seeds: int = Field(default=1, description="Seeds the loop ran (simulate --seeds); the figures are over all of them.")
    tau_se: Num = Field(default=None, description="Standard error of tau_tokens over prompts × seeds.")
    accept_rate_se: Num = Field(default=None, description="Standard error of accept_rate over prompts × seeds.")
    speedup_se: Num = Field(default=None, description="Standard error of speedup from tau_se (timing spread not included).")
    tau_estimate_se: Num = Field(default=None, description="The estimate's own standard error over prompts (tau_renewal_se).")


class MeasuredDepth(Depth):
    """cumulative: accepted at position i ÷ drafts that proposed it (the r_i the estimate
    predicts); cumulative_vllm: vLLM's per-position rate, ÷ all drafts."""

    k: int
    accepted_per_position: list[int]
    drafted_per_position: list[int]
    num_drafts: int
    cumulative_vllm: list[Num] = Field(default_factory=list)
    source: Literal["estimate", "measured"] = "measured"


class MeasuredAdaptive(Part):
    threshold: Num
    k_max: int
    tokens_per_verify: Num
    mean_k: Num
    accept_rate: Num
    tokens_per_s: Num
    speedup: Num
    num_drafts: int


class MeasuredTree(Part):
    """simulate --tree: the tree the real loop drafted and verified, and what it accepted."""

    steps: int
    topk: int
    tokens: int = Field(description="Nodes verified per round, the root included.")
    paths: list[list[int]] | None = None
    label: str
    tau_tokens: Num = Field(description="Measured τ: 1 + Σ_d r_d, r_d = rounds that accepted depth d ÷ rounds whose tree could reach it (bonus token included).")
    tau_estimate: Num = Field(default=None, description="The estimate's τ of this tree (renewal; the chain's at K = steps where the estimate has no tree).")
    mean_acceptance_length: Num = Field(default=None, description="1 + accepted ÷ rounds that drafted (budget-cut rounds included).")
    depth_accept: list[Num] = Field(default_factory=list, description="r_d by depth, from 1.")
    accepted_by_rank: list[list[int]] = Field(default_factory=list, description="[depth][rank]: accepted depth-d nodes that were their parent's rank-(r+1) candidate.")
    rank_shares: list[list[Num]] = Field(default_factory=list, description="accepted_by_rank as shares of each depth's accepted nodes.")
    num_drafts: int = 0
    nodes_per_draft: Num = Field(default=None, description="Tree nodes verified per round that drafted.")


class Measured(Part):
    """What the real draft→verify loop measured (simulate)."""

    k_table: list[MeasuredRow] = Field(default_factory=list)
    depth: MeasuredDepth | None = None
    tree: MeasuredTree | None = Field(default=None, description="simulate --tree: the tree measured (its row in k_table sits at K = its depth).")
    baseline_tokens_per_s: Num = None
    baseline_wall_s: Num = None
    baseline_target_ms_per_step: Num = None
    adaptive: MeasuredAdaptive | None = None
    note: str = ""
    interrupted: bool = False


class TreeRow(Part):
    """One draft tree (SGLang's steps/topk/tokens; a static tree's rank paths): its
    teacher-forced τ (renewal: rounds start where the previous ended; window: every start),
    the cost of one round in target decode steps and the speedup."""

    steps: int
    topk: int
    tokens: int = Field(description="Nodes verified per round, the root included.")
    paths: list[list[int]] | None = None
    label: str
    tau_tokens: Num
    tau_window_tokens: Num = None
    tokens_per_verify: Num = None
    round_cost: Num = None
    speedup: Num = None
    estimate: Literal["paths", "reference"] | None = Field(
        default=None,
        description="The run's own tree only. paths: each round drafted on its candidate paths and verified by the target "
        "(every node's children and acceptance after its own path); reference: every depth-d node given the reference's "
        "depth-d candidates and target probabilities, as the grid's other trees are.",
    )


class TreeNode(Part):
    """One node of the run's tree by its rank path ([0, 1]: the first candidate's second
    child): how often a round verifies it and how likely it is on the accepted path."""

    path: list[int]
    verified: Num = Field(description="Share of rounds whose tree holds this node.")
    accepted: Num = Field(description="Probability, per round, that the accepted path passes through it.")


class TreeOwn(TreeRow):
    """The run's own tree, with its evidence: acceptance by depth and, per depth, the share
    of accepted nodes that were their parent's rank-1, 2, … candidate."""

    depth_accept: list[Num] = Field(default_factory=list)
    nodes: list[TreeNode] = Field(default_factory=list, description="The most often verified nodes (up to 64), by rank path.")
    rank_shares: list[list[Num]] = Field(default_factory=list)
    tau_reference_tokens: Num = Field(default=None, description="With estimate = paths: the same tree's τ the grid's way (along the reference), for comparison.")
    paths_stride: int | None = Field(default=None, description="With estimate = paths: the tree was drafted on its candidate paths at every N-th start (1: every start).")
    paths_starts: int | None = Field(default=None, description="With a stride above 1: the starts drafted on their paths, of paths_positions.")
    paths_positions: int | None = None
    paths_shift: list[Num] = Field(default_factory=list, description="With a stride above 1: per depth, the mean difference (drafted on the paths − along the reference) of a round's survival at the drafted starts, added to every other start.")
    paths_shift_se: list[Num] = Field(default_factory=list, description="Its standard error, per depth.")
    paths_tau_low_tokens: Num = Field(default=None, description="With a stride above 1: τ with the shift one standard error lower (the sampling of starts' uncertainty).")
    paths_tau_high_tokens: Num = Field(default=None, description="… and one standard error higher.")
    chain_tau_tokens: Num = Field(default=None, description="The chain of the same depth (topk 1).")
    chain_speedup: Num = None


class TreeBatch(Part):
    """The best tree and chain at one batch size, priced with its own timed costs."""

    batch_size: int
    best_tree: TreeRow | None = None
    best_chain: TreeRow | None = None


class LiveCheck(Part):
    """diagnose --against: the run's prompts on the user's live server, its counters beside
    the prediction at the server's K. Per-position lists are indexed from draft position 1
    (vLLM's per-position rate: accepted at that position ÷ drafts); *_se are standard errors
    over prompts (served: over requests, one per prompt)."""

    url: str
    model: str
    engine: str
    engine_version: str | None = Field(default=None, description="The release the server reports (vLLM: /version).")
    k: int = Field(description="The K the server drafts: its draft tokens ÷ drafts.")
    prompts: int = Field(description="Prompts there were to send.")
    requests: int = Field(description="Requests answered (one per prompt).")
    counted_by: str = Field(default="totals", description="How each request was counted: 'response', by its answer's own counters (vLLM's --per-request-spec-decode-metrics), or 'totals', by the server's /metrics delta across it.")
    in_flight: int = Field(default=1, description="Requests sent at once after the first (1 when the server's totals count them).")
    stopped: str | None = Field(default=None, description="Why fewer than all prompts were sent (deadline, Ctrl-C, a server error).")
    drafts: float
    draft_tokens: float
    accepted: float
    accept_rate: Num = Field(description="The server's accepted ÷ drafted over these requests.")
    accept_rate_se: Num = None
    per_position: list[Num] = Field(default_factory=list)
    per_position_se: list[Num] = Field(default_factory=list)
    predicted_accept_rate: Num = Field(description="The renewal estimate's accepted ÷ drafted at the server's K (the K table's accept_rate_renewal).")
    predicted_accept_rate_se: Num = None
    predicted_per_position: list[Num] = Field(default_factory=list)
    predicted_per_position_se: list[Num] = Field(default_factory=list)
    gap_rel: Num = Field(description="(served − predicted) ÷ predicted.")
    gap_z: Num = Field(description="(served − predicted) ÷ √(se_predicted² + se_served²).")
    known_issues: list[str] = Field(default_factory=list, description="Ids of the engine release's known issues that apply at this temperature.")

    @property
    def counting(self) -> str:
        """How the requests went and were counted, for a report's caption."""
        return counting(self.counted_by, self.in_flight)


def counting(counted_by: str, in_flight: int) -> str:
    """How `diagnose --against` sent and counted its requests, in words."""
    if counted_by == "response":
        return f"{in_flight} at a time after the first, each counted by its own answer"
    return "one at a time, each counted by the server's totals across it"


class RemoteK(Part):
    """One K of the chain at both ends of the served target's bounds."""

    k: int
    tau_low: Num = None
    tau_high: Num = None
    accept_rate_low: Num = None
    accept_rate_high: Num = None
    speedup_low: Num = None
    speedup_high: Num = None


class RemoteWidening(Part):
    """--target-widen: prompts with loose positions asked again with a wider top-n, each
    cut after its last loose position."""

    logprobs: int = Field(description="The wider top-n asked (−1: the whole vocabulary).")
    prompts: int = 0
    positions: int = Field(default=0, description="Loose positions asked again.")
    made_exact: int = Field(default=0, description="Of those, the ones the wider answer made exact.")
    requests: int = 0
    bytes: int = 0
    seconds: Num = None


class RemoteTarget(Part):
    """diagnose --target-server: the target served by an engine, scored teacher-forced from
    its prompt logprobs (the top-n and the actual token per position), the drafter run
    here. Where the drafter's token is not among the listed ones, acceptance is a range:
    every table of the result is its low end, and the ranges are here."""

    url: str
    model: str
    engine: str
    engine_version: str | None = None
    logprobs: int = Field(description="The top-n asked of the server per position (−1: the whole vocabulary).")
    positions: int
    exact_positions: int = Field(description="Positions whose acceptance the listed tokens decide exactly (low = high).")
    exact: bool = Field(description="Every position exact: the result's figures are exact, not low ends.")
    accept_low: Num = Field(default=None, description="Mean per-position acceptance of the engine's drafting, low end.")
    accept_high: Num = None
    greedy_draft_low: Num = Field(default=None, description="Mean p_target(the drafter's argmax), low end.")
    greedy_draft_high: Num = None
    cumulative_low: list[Num] = Field(default_factory=list, description="P(depths 1..d all accepted), d = 1..k_max, low end.")
    cumulative_high: list[Num] = Field(default_factory=list)
    k_table: list[RemoteK] = Field(default_factory=list)
    best_k_low: int | None = None
    best_k_high: int | None = None
    left_out: list[str] = Field(default_factory=list, description="Metrics the top-n cannot give (they need the whole target distribution): null in `metrics`.")
    requests: int = 0
    bytes: int = Field(default=0, description="Bytes of the scoring answers.")
    reference_s: Num = Field(default=None, description="Wall seconds the server took to write the references (a few requests at once).")
    scoring_s: Num = Field(default=None, description="Wall seconds of the scoring: the server's prompt logprobs (a few requests at once) beside the drafter's forward here.")
    positions_per_s: Num = Field(default=None, description="Positions the server scored in this run per wall second of the scoring (prompts resumed from the cache not counted).")
    positions_per_min: Num = Field(default=None, description="The same rate per minute, as the run prints it.")
    server_wait_s: Num = Field(default=None, description="Of scoring_s, the seconds the loop here waited on the server's answers (the rest: the drafter's forward and the bounds here).")
    resumed_prompts: int = Field(default=0, description="Prompts whose scores an interrupted run had kept (the cache), not asked again.")
    widened: RemoteWidening | None = Field(default=None, description="--target-widen: the loose prompts asked again with a wider top-n.")
    notes: list[str] = Field(default_factory=list)


class Trees(Part):
    """Draft trees (diagnose): the run's tree when it has one, and the grid the
    recommendation compares, with the best tree beside the best chain."""

    tree: TreeOwn | None = None
    grid: list[TreeRow] = Field(default_factory=list)
    best_tree: TreeRow | None = None
    best_chain: TreeRow | None = None
    costs: str = Field(default="", description="How the tree rounds were priced.")
    by_batch: list[TreeBatch] = Field(default_factory=list, description="With two or more --batch-sizes timed: the best tree and chain at each.")


# ----------------------------------------------------------------------------- the result
class Result(Document):
    """A check, diagnose or simulate run. Sections a run did not reach stay empty/None:
    `check` and a run stopped by alignment errors have no tables; only `simulate` has
    `measured`."""

    schema_version: Literal[3] = SCHEMA_VERSION
    command: Literal["check", "diagnose", "simulate"]
    specprobe_version: str | None = None
    created: str
    config: RunConfig
    environment: Environment | None = None
    target: Target
    drafter: Drafter
    prompt_set: PromptSetInfo | None = None
    reference: Literal["on-policy", "off-policy"] | None = None
    sampling: SamplingInfo | None = None
    procedure: Procedure | None = Field(default=None, description="The engine's draft-and-verify procedure the estimates follow (diagnose, simulate).")
    alignment: Alignment | None = None
    interrupted: bool = False
    scored: bool = False
    stopped: str | None = Field(default=None, description="Why scoring did not run (alignment errors); null when it ran.")
    metrics: Metrics = Field(default_factory=dict)
    by_domain: list[DomainRow] = Field(default_factory=list)
    by_category: list[DomainRow] = Field(default_factory=list)  # the prompt file's own categories
    by_entropy: list[BucketRow] = Field(default_factory=list)
    by_position: list[BucketRow] = Field(default_factory=list)
    histograms: Histograms | None = None
    depth: Depth | None = None
    k_table: list[KRow] = Field(default_factory=list)
    adaptive: Adaptive | None = None
    cost: Cost | None = None
    positions: Positions | None = None
    measured: Measured | None = None
    drilldown: DrillDown | None = Field(default=None, description="Token-level evidence and what-ifs (diagnose, simulate).")
    context_lengths: list[LengthRow] = Field(default_factory=list, description="Acceptance by context length and domain (diagnose --context-lengths); accept_prob_long_context_ratio is read from it.")
    trees: Trees | None = Field(default=None, description="Draft trees (diagnose --tree, or an engine that verifies trees): the run's tree, the grid, the best tree and chain.")
    live: LiveCheck | None = Field(default=None, description="diagnose --against: the live server's measured acceptance beside the prediction.")
    remote: RemoteTarget | None = Field(default=None, description="diagnose --target-server: the served target's top-n scoring, exact and bounded positions, both ends of the K table.")
    # ---- new sections go here, one optional field each (default None), e.g. renewal τ,
    # per-category tables, token-level drill-down, head coverage, shard provenance.
    verdict: str
    worst_severity: Severity | None = None
    findings: list[Finding] = Field(default_factory=list)
    evaluations: list[Evaluation] = Field(default_factory=list)

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: dict[str, Any]) -> dict[str, Any]:
        return catalogue_names(v)

    @property
    def categories(self) -> list[DomainRow]:
        """The by-category table when the prompt file's categories say more than the
        domains they fold into (Spec-Bench's 13 tasks onto 6 domains); else empty."""
        if [r.group for r in self.by_category] == [r.group for r in self.by_domain]:
            return []
        return list(self.by_category)

    @property
    def best_k(self) -> int | None:
        v = self.metrics.get("best_k")
        return None if v is None else int(v)

    @property
    def best_k_equivalent(self) -> list[int]:
        """The Ks the cost timing could not tell apart at the run's batch size (best_k
        the smallest of them); empty when the best K stood apart."""
        return list(self.cost.best_k_equivalent) if self.cost is not None else []

    def best_k_equivalent_words(self) -> str | None:
        """'K = 1–2 equivalent' (or 'K = 1, 2, 4 equivalent' where the Ks are not
        consecutive) when the timing could not tell the best K from others; else None."""
        return equivalent_words(self.best_k_equivalent)

    def metric(self, name: str) -> float | None:
        """A catalogue metric as a float (None when not measured)."""
        v = self.metrics.get(name)
        return None if v is None else float(v)

    def describe(self) -> str:
        """'self:layers=28 → smollm2' for titles."""
        return f"{self.drafter.spec or self.config.drafter or '?'} → {self.target.spec or self.config.target or '?'}"

    def temperatures(self) -> tuple[float | None, float | None]:
        """(target, drafter) temperatures the run used: the resolved sampling settings
        when present, else the flags."""
        if self.sampling is not None:
            return self.sampling.target.temperature, self.sampling.draft.temperature
        return self.config.temperature, self.config.draft_temperature


def equivalent_words(ks: list[int]) -> str | None:
    """[1, 2] -> 'K = 1–2 equivalent'; [1, 2, 4] -> 'K = 1, 2, 4 equivalent'; fewer than two: None."""
    if len(ks) < 2:
        return None
    run = ks == list(range(ks[0], ks[-1] + 1))
    return f"K = {ks[0]}–{ks[-1]} equivalent" if run else f"K = {', '.join(map(str, ks))} equivalent"
