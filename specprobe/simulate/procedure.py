"""How a run drafts and verifies: the procedure of the engine it stands for, so that what
the loop measures is what that engine would.

    drafting      greedy: each draft is the drafter's argmax (ties: the lowest id), a
                  one-hot q for the verify step; probabilistic: x ~ q
    verify        rejection: accept x with min(1, p(x)/q(x)) (p(x) for a one-hot q), on
                  rejection the next token from norm(max(0, p − q));
                  sample-match: sample the target at each draft position, accept while
                  the sample is the draft; the first sample that is not is the next
                  token, and after K accepted a bonus token is sampled from p
    confidence    what the adaptive threshold compares (`DraftRule.threshold`): max q
                  under the drafter's sampling, or llama.cpp's draft sampler's top
                  probability (its --spec-draft-p-min)
    n_min         drafts shorter than this are dropped (llama.cpp's --spec-draft-n-min)

Greedy drafts verified either way have one law: the draft is accepted with p(draft),
and the token after the last accepted one follows p conditioned on not being the
rejected draft. Both reproduce the target's distribution."""

from __future__ import annotations

from dataclasses import dataclass

from specprobe.metrics.sampling import LLAMA_CPP_DRAFT_TOP_K
from specprobe.settings.engines import (
    BY_ENGINE,
    GREEDY,
    LLAMA_CPP_TOP,
    MAX_Q,
    PROBABILISTIC,
    confidence_of,
)

REJECTION, SAMPLE_MATCH, THRESHOLD = "rejection", "sample-match", "threshold"

# llama.cpp's p_min is compared with its draft sampler's top probability (the drafter's
# LLAMA_CPP_DRAFT_TOP_K best tokens at temperature 1), before that token joins the draft
# (draft-simple; the older `draft` type, --draft-p-min, added it first and stopped after
# it, one token longer)
__all__ = ["LLAMA_CPP_DRAFT_TOP_K", "LLAMA_CPP_TOP", "MAX_Q", "REJECTION", "SAMPLE_MATCH", "THRESHOLD", "Procedure"]  # the names the loop imports from here

# llama.cpp (common_sampler_sample_and_accept_n) and TensorRT-LLM verify by sampling the
# target and comparing; the others run the rejection sampler
_SAMPLE_MATCH_ENGINES = frozenset({"llama.cpp", "trtllm"})


@dataclass(frozen=True)
class Procedure:
    """One engine's draft-and-verify procedure (see module doc)."""

    drafting: str = PROBABILISTIC  # greedy | probabilistic
    verify: str = REJECTION  # rejection | sample-match
    confidence: str = MAX_Q  # max-q | llama.cpp
    n_min: int = 0
    engine: str | None = None  # the engine it stands for; None: the textbook procedure
    p_min: float = 0.0  # llama.cpp's --spec-draft-p-min: every round stops before an unconfident draft
    thresholds: tuple[float, float] = (1.0, 1.0)  # SGLang's (single, acc); below 1 the verify step is THRESHOLD

    def __post_init__(self) -> None:
        if self.drafting not in (GREEDY, PROBABILISTIC) or self.verify not in (REJECTION, SAMPLE_MATCH, THRESHOLD) or self.confidence not in (MAX_Q, LLAMA_CPP_TOP):
            raise ValueError(f"unknown procedure {self}")
        if self.verify == SAMPLE_MATCH and self.drafting != GREEDY:
            # a sampled draft compared with a target sample is accepted with Σ p·q, which
            # no engine's probabilistic drafting runs
            raise ValueError("sample-match verifies greedy drafts only")

    @classmethod
    def of(cls, engine: str, drafting: str | None = None, n_min: int = 0, p_min: float = 0.0, thresholds: tuple[float, float] = (1.0, 1.0)) -> Procedure:
        """The engine's procedure, with its drafting overridden by `drafting` when given.
        Sampled drafts are verified by rejection sampling whatever the engine: that is
        what --draft-sampling probabilistic promises (acceptance Σ min(p, q))."""
        d = drafting or BY_ENGINE[engine].draft_sampling
        relaxed = engine == "sglang" and d == GREEDY and min(thresholds) < 1
        return cls(
            drafting=d,
            verify=THRESHOLD if relaxed else SAMPLE_MATCH if engine in _SAMPLE_MATCH_ENGINES and d == GREEDY else REJECTION,
            confidence=confidence_of(engine),
            n_min=n_min,
            engine=engine,
            p_min=p_min,
            thresholds=(float(thresholds[0]), float(thresholds[1])) if relaxed else (1.0, 1.0),
        )

    @property
    def greedy(self) -> bool:
        return self.drafting == GREEDY

    def describe(self) -> str:
        """The procedure in words, for the result's record."""
        if self.verify == THRESHOLD:
            single, acc = self.thresholds
            how = (f"greedy drafts (the drafter's argmax), accepted outright where p(draft) ≥ {single:g} (threshold_single), else with min(1, p(draft) ÷ {acc:g}) "
                   "(threshold_acc); on a rejection the next token from p without the draft — lossy: the output is no longer the target's distribution")
        elif self.verify == SAMPLE_MATCH:
            how = "greedy drafts (the drafter's argmax), verified by sampling the target at each draft position and accepting while its sample is the draft (the first other sample is the next token)"
        elif self.greedy:
            how = "greedy drafts (the drafter's argmax, a one-hot q), accepted with p(draft), else the next token from norm(max(0, p − onehot(draft)))"
        else:
            how = "sampled drafts (x ~ q), accepted with min(1, p/q), else the next token from norm(max(0, p − q))"
        if self.p_min > 0:
            how += f"; every draft stops before a token whose probability among the drafter's {LLAMA_CPP_DRAFT_TOP_K} best tokens (temperature 1) is below --spec-draft-p-min {self.p_min:g}"
        elif self.confidence == LLAMA_CPP_TOP:
            how += f"; adaptive K as --spec-draft-p-min: drafting stops before a draft whose probability among the drafter's {LLAMA_CPP_DRAFT_TOP_K} best tokens (temperature 1) is below the threshold"
        if self.n_min > 1:
            how += f"; drafts shorter than {self.n_min} dropped"
        return how if self.engine is None else f"as {BY_ENGINE[self.engine].label} runs it: {how}"
