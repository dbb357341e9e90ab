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

from specprobe.engines import GREEDY, PROBABILISTIC, get
from specprobe.engines.base import REJECTION, SAMPLE_MATCH

THRESHOLD = "threshold"  # an engine's relaxed acceptance (thresholds below 1)
MAX_Q = 0  # `confidence`: max q under the drafter's sampling; N > 0: its draft sampler's top of N

__all__ = ["MAX_Q", "REJECTION", "SAMPLE_MATCH", "THRESHOLD", "Procedure"]  # the names the loop imports from here


@dataclass(frozen=True)
class Procedure:
    """One engine's draft-and-verify procedure (see module doc)."""

    drafting: str = PROBABILISTIC  # greedy | probabilistic
    verify: str = REJECTION  # rejection | sample-match
    confidence: int = MAX_Q  # 0: max q; N: the draft sampler's top of the drafter's N best (`Engine.confidence_top_n`)
    n_min: int = 0
    engine: str | None = None  # the engine it stands for; None: the textbook procedure
    p_min: float = 0.0  # the engine's early stop (--spec-draft-p-min): every round stops before an unconfident draft
    thresholds: tuple[float, float] = (1.0, 1.0)  # the engine's relaxed (single, acc); below 1 the verify step is THRESHOLD

    def __post_init__(self) -> None:
        if self.drafting not in (GREEDY, PROBABILISTIC) or self.verify not in (REJECTION, SAMPLE_MATCH, THRESHOLD) or self.confidence < 0:
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
        e = get(engine)
        d = e.drafting(drafting)
        relaxed = e.relaxed_thresholds and d == GREEDY and min(thresholds) < 1
        return cls(
            drafting=d,
            verify=THRESHOLD if relaxed else e.greedy_verify if d == GREEDY else REJECTION,
            confidence=e.confidence_top_n,
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
            how += f"; every draft stops before a token whose probability among the drafter's {self.confidence} best tokens (temperature 1) is below --spec-draft-p-min {self.p_min:g}"
        elif self.confidence:
            how += f"; adaptive K as --spec-draft-p-min: drafting stops before a draft whose probability among the drafter's {self.confidence} best tokens (temperature 1) is below the threshold"
        if self.n_min > 1:
            how += f"; drafts shorter than {self.n_min} dropped"
        return how if self.engine is None else f"as {get(self.engine).label} runs it: {how}"
