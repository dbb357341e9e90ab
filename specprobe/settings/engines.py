"""The serving engines specprobe predicts for, and what each does by default: whose
sampling transform it applies and how it drafts and verifies. `--engine` picks one;
`--draft-sampling` overrides its drafting.

Read from each engine's source:

vllm: `speculative_config.draft_sample_method`, default "greedy": the proposal is the
    drafter's argmax, a one-hot q for the rejection sampler, so a draft token is
    accepted with probability p_target(argmax q); "probabilistic" samples the draft from
    q and accepts with min(1, p/q) — acceptance Σ min(p, q).
sglang: EAGLE / EAGLE-3 / STANDALONE candidates are the drafter's top tokens;
    `tree_speculative_sampling_target_only` verifies with the target's probabilities
    (thresholds 1.0 by default): a chain accepts its draft with p_target(draft).
llama.cpp: `llama-server --spec-type draft-simple` drafts the drafter's top token, then
    samples the target at each draft position with the request's sampler chain and
    accepts while the sample equals the draft: p_target(draft) again. Its chain
    truncates before the temperature (sampling semantics "llama.cpp"), and
    `--spec-draft-p-min P` stops drafting before the first draft token whose drafter
    probability is below P: adaptive K with the engine's own knob.
trtllm: TensorRT-LLM's draft-target and EAGLE paths propose the drafter's top token and
    accept it while the target's own sample agrees (greedy drafting).
transformers: assisted generation with do_sample samples the candidates from the
    assistant and verifies them by speculative sampling (Leviathan et al.): Σ min(p, q).
"""

from __future__ import annotations

from dataclasses import dataclass

GREEDY, PROBABILISTIC = "greedy", "probabilistic"
# a drafter's confidence, which adaptive K (and llama.cpp's --spec-draft-p-min) compares
# with its threshold: max q under the drafter's sampling, or llama.cpp's draft sampler's
MAX_Q, LLAMA_CPP_TOP = "max-q", "llama.cpp"
DRAFT_SAMPLING = (GREEDY, PROBABILISTIC)


@dataclass(frozen=True)
class Engine:
    name: str  # as --engine takes it
    label: str  # as people write it
    semantics: str  # whose sampling transform (`metrics.sampling`)
    draft_sampling: str  # its default drafting: greedy | probabilistic
    knob: str  # where the engine sets its drafting, for the messages
    adaptive_knob: str | None = None  # the engine's own flag for the adaptive-K threshold


ENGINES: tuple[Engine, ...] = (
    Engine("vllm", "vLLM", "vllm", GREEDY, "speculative_config.draft_sample_method"),
    Engine("sglang", "SGLang", "sglang", GREEDY, "its EAGLE candidates (top tokens by draft score)"),
    Engine("llama.cpp", "llama.cpp", "llama.cpp", GREEDY, "--spec-type draft-simple (the drafter's top token)", "--spec-draft-p-min"),
    Engine("trtllm", "TensorRT-LLM", "vllm", GREEDY, "its draft-target / EAGLE decoding config"),
    Engine("transformers", "transformers", "transformers", PROBABILISTIC, "assisted generation (the assistant samples with do_sample)"),
)
BY_ENGINE = {e.name: e for e in ENGINES}
ENGINE_NAMES = tuple(e.name for e in ENGINES)


def procedure(draft_sampling: str) -> str:
    """The acceptance law of one draft token under a drafting, in words."""
    if draft_sampling == GREEDY:
        return "greedy drafts, acceptance = p_target(draft token)"
    return "sampled drafts, acceptance = Σ min(p, q)"


def describe(engine: str, draft_sampling: str) -> str:
    """'as vLLM verifies it: greedy drafts, acceptance = p_target(draft token)'."""
    return f"as {BY_ENGINE[engine].label} verifies it: {procedure(draft_sampling)}"


def confidence_of(engine: str) -> str:
    """Whose drafter confidence an engine's adaptive K reads."""
    return LLAMA_CPP_TOP if engine == "llama.cpp" else MAX_Q

