"""What a serving engine is to specprobe: the interface every engine module fills in.

An engine is a dialect. Its module (one per engine, beside this file) holds what that
engine does, read from its source: the sampling transform and the order its truncations
compose in, how it drafts and verifies by default, which of its own knobs stand for
specprobe's settings, and what it refuses. The rest of specprobe asks the engine object
(`specprobe.engines.get(name)`) and never compares engine names.

This module and the engine modules import nothing heavier than `specprobe.core`: the
metrics, the settings, the pipelines and the torch-free commands all ask them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from specprobe.core.errors import ConfigError

# how an engine drafts (`--draft-sampling`)
GREEDY, PROBABILISTIC = "greedy", "probabilistic"
DRAFT_SAMPLING = (GREEDY, PROBABILISTIC)
# how it verifies greedy drafts: the rejection sampler with a one-hot q, or by sampling
# the target at each draft position and accepting while the sample is the draft
REJECTION, SAMPLE_MATCH = "rejection", "sample-match"
# how its sampling truncations (top-k, top-p, min-p) compose (`metrics.sampling`):
# one after another, each on what the previous one left, renormalised, in `steps`' order;
# all three on the same tempered distribution (a joint mask); or on the UNTEMPERED
# distribution before the temperature divides what survives
SEQUENTIAL, JOINT, UNTEMPERED = "sequential", "joint", "untempered"


@dataclass(frozen=True)
class SamplingOrder:
    """How one engine turns logits into the distribution it samples from."""

    name: str  # the name `--sampling-semantics` takes and the result records
    truncation: str  # SEQUENTIAL | JOINT | UNTEMPERED
    steps: tuple[str, ...] = ()  # SEQUENTIAL's order of "min_p", "top_k", "top_p"
    greedy_below: float = 0.0  # temperatures below this sample greedily (0: only T ≤ 0)
    top_k_default: int = 0  # the top-k a request gets when nothing sets one (0: off)
    # the temperature is greedy unless generation_config's do_sample says otherwise
    greedy_without_do_sample: bool = False

    def __post_init__(self) -> None:
        if self.truncation not in (SEQUENTIAL, JOINT, UNTEMPERED) or (self.truncation == SEQUENTIAL and sorted(self.steps) != ["min_p", "top_k", "top_p"]):
            raise ValueError(f"unknown sampling order {self}")


@dataclass(frozen=True)
class SpecCounters:
    """An engine's speculative-decoding counters as one scrape of its metrics states them
    (totals since it started), or the difference of two scrapes."""

    drafts: float  # rounds that drafted
    draft_tokens: float  # tokens drafted
    accepted: float  # draft tokens accepted
    per_pos: tuple[float, ...] = ()  # accepted at draft position i (0-based), as the engine counts

    @property
    def accept_rate(self) -> float:
        """Accepted ÷ drafted (nan when nothing was drafted)."""
        return self.accepted / self.draft_tokens if self.draft_tokens else math.nan

    @property
    def per_pos_rate(self) -> list[float]:
        """Per-position acceptance as vLLM states it: accepted at position i ÷ drafts."""
        return [a / self.drafts if self.drafts else math.nan for a in self.per_pos]

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.per_pos), len(other.per_pos))
        a = list(self.per_pos) + [0.0] * (n - len(self.per_pos))
        b = list(other.per_pos) + [0.0] * (n - len(other.per_pos))
        return SpecCounters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens, self.accepted - other.accepted, tuple(x - y for x, y in zip(a, b, strict=True)))


@dataclass(frozen=True)
class KnownBug:
    """A fact about given releases of an engine that makes what it measures wrong: which
    versions on which platform, under what condition, what it does and the workaround."""

    name: str
    versions: tuple[str, ...]  # release numbers as the engine reports them (a "+local" tail ignored)
    platform: str  # the platform it names itself by ("cpu"); "" for any
    condition: str  # when it bites, in words ("T > 0")
    effect: str
    workaround: str
    sampled_only: bool = False  # only requests that sample (T > 0) meet it

    def affects(self, version: str | None, platform: str | None) -> bool:
        """Whether a server at `version` on `platform` has it (both must be known)."""
        if not version or (self.platform and not platform):
            return False
        return version.split("+")[0] in self.versions and (not self.platform or str(platform).lower() == self.platform)

    def may_affect(self, version: str | None, temperature: float) -> bool:
        """Whether a server reporting `version` may have it at this temperature, where its
        platform cannot be seen (a live server's API does not say): the message names it."""
        if not version or (self.sampled_only and temperature <= 0):
            return False
        return version.split("+")[0] in self.versions


class LiveServer:
    """A running server of one engine, reached over its HTTP API: what `diagnose
    --against` sends the run's prompts to. Subclasses talk the engine's own API."""

    engine: Engine
    url: str
    model: str
    version: str | None

    def counters(self) -> SpecCounters:
        """Its speculative-decoding counters now (totals since it started)."""
        raise NotImplementedError

    def complete(self, prompt: Sequence[int], max_tokens: int, sampling: Mapping[str, float], seed: int, timeout: float) -> list[int]:
        """One completion of `prompt` (token ids, sent as ids: nothing re-tokenised) with
        the target's sampling (temperature, top_k, top_p, min_p as specprobe holds them);
        the token ids it generated."""
        raise NotImplementedError

    def complete_counted(self, prompt: Sequence[int], max_tokens: int, sampling: Mapping[str, float], seed: int, timeout: float) -> tuple[list[int], SpecCounters | None]:
        """complete(), and that request's own speculative-decoding counters where the
        answer carries them (None: only the server's totals count it, so requests must go
        one at a time for each one's share to be known)."""
        return self.complete(prompt, max_tokens, sampling, seed, timeout), None

    # --- the served target scored teacher-forced (diagnose --target-server)
    tokenizer_name: str | None = None  # what the server loaded the tokenizer from, where it says

    def prompt_logprobs(self, ids: Sequence[int], n: int, timeout: float) -> PromptScores:
        """The target's logprobs over `ids` (sent as ids): per position after the first,
        the actual token and the top-`n` (−1: the whole vocabulary)."""
        raise ConfigError(f"--target-server: specprobe cannot score prompts on {self.engine.label} yet", "serve the target with vLLM")

    # whether the API takes n = −1 for every token's logprob (vLLM's prompt_logprobs does)
    lists_every_token: bool = True
    # whether the server also scores token ids it is given, at every position (SGLang's
    # `token_ids_logprob`): then the drafter's argmax is scored wherever it ranks
    scores_chosen: bool = False

    def prompt_logprobs_chosen(self, ids: Sequence[int], n: int, chosen: Sequence[int], timeout: float) -> PromptScores:
        """prompt_logprobs, and at every position also the logprobs of the ids `chosen`
        (listed beside the top-n with a rank past n where they are not among them)."""
        raise ConfigError(f"--target-server: {self.engine.label}'s API scores no chosen token ids", "leave the scoring to the top-n")

    def tokenize(self, text: str, timeout: float) -> list[int] | None:
        """The server's own token ids for `text` (None: it has no tokenize endpoint)."""
        return None


@dataclass
class PromptScores:
    """One prompt_logprobs answer: rows[i] for position i + 1 of the ids sent ({token id:
    (logprob, rank)}: the top-n and the actual token), and what the answer cost."""

    rows: list[dict[int, tuple[float, int]]]
    bytes: int = 0


class Engine:
    """One serving engine. Subclasses set the class attributes; the methods are the
    engine's own answers, with the textbook defaults here."""

    name: ClassVar[str]  # as --engine takes it
    label: ClassVar[str]  # as people write it
    sampling: ClassVar[SamplingOrder]  # whose sampling transform it applies
    draft_sampling: ClassVar[str] = GREEDY  # its default drafting
    knob: ClassVar[str]  # where the engine sets its drafting, for the messages
    adaptive_knob: ClassVar[str | None] = None  # its own flag for the adaptive-K threshold
    greedy_verify: ClassVar[str] = REJECTION  # how it verifies greedy drafts
    # the drafter confidence its adaptive K (or early stop) reads: 0 is max q under the
    # drafter's sampling; N > 0 is its draft sampler's: the top token's probability among
    # the drafter's N best tokens at temperature 1
    confidence_top_n: ClassVar[int] = 0
    verifies_trees: ClassVar[bool] = False  # whether it verifies draft trees (else chains)
    relaxed_thresholds: ClassVar[bool] = False  # accept thresholds below 1 (lossy) are its knob
    draft_stops: ClassVar[bool] = False  # it stops drafts early (p_min) and drops short ones (n_min)
    drafts_stop_at_end_of_generation: ClassVar[bool] = False  # an n-gram draft stops at an end-of-generation token
    # a sampled (probabilistic) draft is drawn from the drafter's tempered distribution
    # alone: the request's top-k, top-p and min-p shape the target's p, never the draft's q
    draft_temperature_only: ClassVar[bool] = False
    serving_config: ClassVar[bool] = True  # it has a serving config `export` can write
    # its own knobs a serving config may set, as settings: setting name -> the key its
    # serving config reader files them under (`ServingConfig.extra`)
    serving_knobs: ClassVar[Mapping[str, str]] = {}
    # EAGLE-3: how it reads a head's aux layer ids (hidden_states[id + offset]; None: it
    # runs no EAGLE-3 head of its own capture), and the checkpoint format trained with
    # its convention (None: any other format, where `eagle3_default_for_other_formats`)
    eagle3_aux_offset: ClassVar[int | None] = None
    eagle3_format: ClassVar[str | None] = None
    eagle3_default_for_other_formats: ClassVar[bool] = False
    # model-free drafting (`drafters/ngram.py`): the n-gram drafter types that are its own
    # method, whether it owns every type no engine names, and whether it runs a draft model
    # beside its n-gram types
    ngram_types: ClassVar[tuple[str, ...]] = ()
    ngram_default: ClassVar[bool] = False
    ngram_with_draft_model: ClassVar[bool] = False
    # --- production monitoring (`specprobe monitor`, `specprobe alerts`) ---
    # the name monitor's --engine and its detected families give the engine's metrics,
    # logs and records (None: nothing of its own to monitor); its metric names, log
    # parsers and rule names are in its package's `monitor` module
    monitor_family: ClassVar[str | None] = None
    # releases whose served acceptance is wrong under some condition (`monitor` warns
    # where it can see the version and platform)
    known_bugs: ClassVar[tuple[KnownBug, ...]] = ()

    def describe(self, draft_sampling: str) -> str:
        """'as vLLM verifies it: greedy drafts, acceptance = p_target(draft token)'."""
        return f"as {self.label} verifies it: {procedure(draft_sampling)}"

    def drafting(self, draft_sampling: str | None) -> str:
        """greedy | probabilistic: the given drafting, else the engine's own."""
        return draft_sampling or self.draft_sampling

    def greedy_knob(self, drafting_default: bool) -> str:
        """Where the engine's greedy drafting is set, for the messages."""
        if not drafting_default:
            return "--draft-sampling greedy"
        return self.knob.split(" (")[0] if " (" in self.knob else f"{self.knob}: greedy"

    def vocab_findings(self, tt: Any, dt: Any, vt: int, vd: int, tj: Mapping[str, Any], dj: Mapping[str, Any], m: dict[str, Any], ev: dict[str, list[str]]) -> None:
        """Whether the engine pairs the two vocabularies (tokenizers `tt`, `dt`; sizes
        `vt`, `vd`; their tokenizer.json descriptions `tj`, `dj`) as they are, in its own
        terms: sets `engine_vocab_incompatible` and `vocab_shared_frac` in `m` (None where
        the engine has no rule of its own) and their evidence lines in `ev`."""
        m["engine_vocab_incompatible"] = None
        m["vocab_shared_frac"] = None

    def draft_model_findings(self, dc: Any, m: dict[str, Any], ev: dict[str, list[str]]) -> None:
        """Whether the engine starts with a separate draft model of config `dc` at all, in
        its own terms: sets `engine_draft_unsupported` in `m` (None where the engine has
        no rule of its own) and its evidence lines in `ev`."""
        m["engine_draft_unsupported"] = None

    def live_server(self, url: str, model: str | None = None, timeout: float = 30.0) -> LiveServer:
        """A client for a running server of this engine at `url`, serving `model` (None:
        the one model it serves)."""
        raise ConfigError(f"--against: specprobe cannot read {self.label}'s speculative-decoding counters from a live server yet", "use --engine vllm with a vLLM server, or compare with 'specprobe monitor' on its metrics")

    def relaxed_acceptance(self, extra: Mapping[str, Any]) -> bool:
        """Whether a serving config's own keys (`extra`) turn on a lossy acceptance that
        specprobe does not estimate (TensorRT-LLM's relaxed acceptance for thinking)."""
        return False

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


def procedure(draft_sampling: str) -> str:
    """The acceptance law of one draft token under a drafting, in words."""
    if draft_sampling == GREEDY:
        return "greedy drafts, acceptance = p_target(draft token)"
    return "sampled drafts, acceptance = Σ min(p, q)"


# ----------------------------------------------------------------------------- vocabularies, as several engines read them
def space_prefixes(tok: Any) -> tuple[str, ...]:
    """The mark a tokenizer puts on word-initial spaces (Ġ, ▁), found by encoding ' a'."""
    try:
        ids = tok.encode(" a", add_special_tokens=False)
        piece = tok.convert_ids_to_tokens(ids[0]) if ids else None
        if isinstance(piece, str) and len(piece) > 1 and piece.endswith("a") and piece[0] not in (" ", "\t"):
            return (piece[:-1],)
    except Exception:
        pass
    return ("\u0120", "\u2581")


def normalised_vocab(tok: Any) -> set[str]:
    """A tokenizer's token texts with its word-initial space mark written as a space."""
    prefixes = space_prefixes(tok)
    out: set[str] = set()
    for t in tok.get_vocab():
        p = next((x for x in prefixes if t.startswith(x)), None)
        out.add(" " + t[len(p) :] if p else t)
    return out


def shared_vocab_frac(tt: Any, dt: Any, vt: int) -> float:
    """Share of the target's vocabulary whose token text (word-initial space marks made
    alike) the drafter's vocabulary also holds: what a draft model with its own
    vocabulary can propose."""
    return len(normalised_vocab(tt) & normalised_vocab(dt)) / max(vt, 1)
