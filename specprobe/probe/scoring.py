"""Teacher-forced scoring of target against drafter over prompt + reference continuation.

One target forward pass per batch (hidden states of the layers the drafter reads are
caught by hooks), then the scored positions in chunks: position t predicts reference
token t+1, so every chunk is a [N, V] slice of target logits and, per drafter depth d,
[N, V'] drafter logits made at position t+1−d. `score_chunk` turns one chunk into
per-position metrics — a pure function of those logits; everything else here is
batching and bookkeeping. A head drafter's chunk goes to `score_head_chunk` instead
where the dispatch table (`metrics.dispatch`) says so: its logits stay in its own draft
vocabulary and the target's side is computed once for every depth; depths past a Medusa
checkpoint's last head count α = 0. Memory stays bounded by
batch_size × chunk_positions × vocab, whatever the number of prompts.

Collectors receive every chunk's scores: `SequenceCollector` feeds the accumulator and
the per-position rows; token-level drill-down or a distributed reduction plug in as
further collectors (`score(..., collectors=[...])`) without touching the loop.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specprobe.core.progress import Progress
from specprobe.drafters.base import Drafter, TargetPass
from specprobe.metrics.accumulate import Accumulator
from specprobe.metrics.blocked import on_workers
from specprobe.metrics.core import align_vocab, position_metrics
from specprobe.metrics.dispatch import Head, Scorer, case, pick
from specprobe.metrics.sampling import sampler_top_confidence
from specprobe.metrics.tree import passing as tree_passing
from specprobe.models.anatomy import capture_layers
from specprobe.models.heads.chain import HeadDrafter
from specprobe.models.heads.vocab import (
    DepthScores,
    ScoringVocab,
    TargetSide,
    cat_scores,
    depth_scores,
    map_logits,
    target_side,
)
from specprobe.models.loader import LoadedModel
from specprobe.probe.alignment import SamplingPair
from specprobe.probe.chunks import ROW_FIELDS, Chunk, ChunkScores, Collector, Probe, Row, _runs
from specprobe.probe.memory import Backoff, Buffered, chunk_for
from specprobe.prompts import Prompt
from specprobe.settings.pipeline import DiagnoseConfig

if TYPE_CHECKING:
    from specprobe.probe.drilldown import DrillCollector


def score_chunk(
    target_logits: torch.Tensor,  # [N, V]
    draft_logits: Iterable[tuple[int, torch.Tensor]],  # (d, [N, V'])
    token_pos: torch.Tensor,  # [N]
    sampling: SamplingPair,
    top: int = 0,
    probes: Sequence[Probe] = (),
    chunk: Chunk | None = None,
    vocab: ScoringVocab | None = None,
) -> ChunkScores:
    """target_logits [N, V]; draft_logits yields (depth d, [N, V'] logits of the depth-d
    prediction of each position's token), lazily so one [N, V'] block is alive at a time;
    token_pos [N] (tensor) the predicted token's index; sampling the (target, draft) pair.
    top > 0: each side's top-`top` tokens too; probes: run on the depth-1 logits.
    vocab: a head drafter's `ScoringVocab` — its logits are then over its own draft
    vocabulary, scored there (`score_head_chunk`)."""
    if vocab is not None and not _plain_head(target_logits, vocab, sampling):
        return score_head_chunk(target_logits, draft_logits, token_pos, sampling, vocab, top, probes, chunk)
    out = ChunkScores({})
    for d, dl in draft_logits:
        pm = position_metrics(target_logits, dl, sampling.target, sampling.draft, top=top if d == 1 else 0)
        if d == 1:
            out.values = {f: getattr(pm, f).float().cpu().numpy() for f in ROW_FIELDS}
            out.extra = {k: v.cpu().numpy() for k, v in (pm.top or {}).items()}
            for probe in probes:
                assert chunk is not None
                out.extra.update(probe(chunk, target_logits, dl))
            out.broken = _broken(list(out.values.values()), target_logits, dl, out.broken)
        else:
            _deeper(out, d, pm.accept_prob, pm.draft_confidence, token_pos, dl, pm.accept_prob_greedy_draft)
        del dl, pm
    return out


def _plain_head(target_logits: torch.Tensor, vocab: ScoringVocab, sampling: SamplingPair) -> bool:
    """Whether a head's chunk is scored depth by depth as any drafter's is (the dispatch
    table's choice: a head over the target's whole vocabulary that the compiled rows take)."""
    head: Head = "full" if vocab.ids is None and vocab.keep is None else "draft"
    return pick(case(target_logits, None, sampling.target, sampling.draft, head)).scorer is not Scorer.HEAD


def score_head_chunk(
    target_logits: torch.Tensor,  # [N, V]
    draft_logits: Iterable[tuple[int, torch.Tensor]],  # (d, [N, Vd]) in the head's vocabulary
    token_pos: torch.Tensor,  # [N]
    sampling: SamplingPair,
    vocab: ScoringVocab,
    top: int = 0,
    probes: Sequence[Probe] = (),
    chunk: Chunk | None = None,
    block_rows: int | None = None,
) -> ChunkScores:
    """`score_chunk` for a head drafter: draft_logits yields [N, Vd] logits over the head's
    draft vocabulary (its `ScoringVocab`). The target's side is computed once and shared by
    every depth; depth 1 gets every metric (KL over the draft vocabulary), depths ≥ 2 the
    α and max q the depth curves read. Same values as mapping each depth into the target
    vocabulary and running `position_metrics` (tests/test_heads.py), KL aside.

    On a CPU the chunk is scored HEAD_BLOCK_ROWS rows at a time (the block's buffers stay
    in cache), each of torch's threads taking whole blocks with its ops on one core, as
    `metrics.blocked` does (SPECPROBE_METRICS_THREADS=0: every op split across the threads
    instead): ops this small lose more to thread hand-offs than they gain, most of all on
    a shared machine (benchmarks/bench_heads.py). Every depth's logits are computed first,
    at full threads. Elsewhere the chunk is one block and one depth's logits are alive at
    a time. block_rows: rows per block (0: the whole chunk, lazily), None: as just said."""
    out = ChunkScores({})
    prepped = ((d, _in_draft_vocab(dl, vocab)) for d, dl in draft_logits)
    if block_rows is None:
        block_rows = HEAD_BLOCK_ROWS if str(target_logits.device) == "cpu" else 0
    if block_rows <= 0:
        ts = target_side(target_logits, sampling.target, vocab, top)
        for d, dl in prepped:
            sc = depth_scores(ts, dl, sampling.draft, full=d == 1, top=top if d == 1 else 0)
            _emit(out, d, sc, greedy_draft(ts, dl), ts.entropy, target_logits, dl, token_pos, vocab, probes, chunk)
            del dl
        return out
    drafts = list(prepped)  # [N, Vs] per depth
    n = target_logits.shape[0]
    # block start -> (entropy [b], depth -> scores, depth -> p(argmax q) [b])
    done: dict[int, tuple[torch.Tensor, dict[int, DepthScores], dict[int, torch.Tensor]]] = {}

    def blocks(starts: list[int]) -> None:
        for r0 in starts:
            r = slice(r0, r0 + block_rows)
            ts = target_side(target_logits[r], sampling.target, vocab, top)
            scores = {d: depth_scores(ts, dl[r], sampling.draft, full=d == 1, top=top if d == 1 else 0) for d, dl in drafts}
            done[r0] = (ts.entropy, scores, {d: greedy_draft(ts, dl[r]) for d, dl in drafts})

    starts = list(range(0, n, block_rows))
    threads = torch.get_num_threads()
    if threads > 1 and len(starts) > 1 and os.environ.get("SPECPROBE_METRICS_THREADS", "1") != "0":
        # as `metrics.blocked` does: each thread takes whole blocks, its ops on one core (an
        # op split across cores ends in a barrier: on a busy machine, a time slice)
        torch.set_num_threads(1)
        try:
            on_workers(blocks, starts, threads)
        finally:
            torch.set_num_threads(threads)
    else:
        blocks(starts)
    entropy = torch.cat([done[r0][0] for r0 in starts])
    for d, dl in drafts:
        _emit(out, d, cat_scores([done[r0][1][d] for r0 in starts]), torch.cat([done[r0][2][d] for r0 in starts]), entropy, target_logits, dl, token_pos, vocab, probes, chunk)
    return out


def engine_confidence(drafts: Iterable[tuple[int, torch.Tensor]], confidence: int) -> tuple[Iterable[tuple[int, torch.Tensor]], dict[int, np.ndarray]]:
    """The drafter confidence an engine's early stop reads, where it is not max q (a
    `confidence` N > 0): its draft sampler's top token's probability among the drafter's
    N best (`sampler_top_confidence`), taken from each
    depth's logits as they pass to the scorer -> (the same logits, depth -> [N] filled as
    they pass). `with_confidence` puts them in the chunk's scores."""
    seen: dict[int, np.ndarray] = {}
    if not confidence:
        return drafts, seen

    def passing() -> Iterable[tuple[int, torch.Tensor]]:
        for d, dl in drafts:
            seen[d] = sampler_top_confidence(dl, confidence).cpu().numpy()
            yield d, dl

    return passing(), seen


def with_confidence(scores: ChunkScores, seen: dict[int, np.ndarray]) -> ChunkScores:
    """`engine_confidence`'s values in place of max q (depth 1: the row's draft_confidence)."""
    for d, conf in seen.items():
        if d == 1:
            scores.values["draft_confidence"] = conf
        else:
            scores.confidence_by_depth[d] = conf
    return scores


def greedy_draft(ts: TargetSide, dl: torch.Tensor) -> torch.Tensor:
    """[N] p(argmax q) of a head's depth: dl [N, Vs] its logits over the kept draft columns
    (in draft order, so the first maximal column is the lowest draft id, as the engines'
    argmax over the head's vocabulary), ts the chunk's target side. A greedy target
    accepts exactly its own argmax (0 when that lies outside the draft vocabulary)."""
    da = dl.argmax(-1, keepdim=True)  # [N, 1]
    if ts.pd is None:
        return (ts.col == da.squeeze(-1)).float()
    return ts.pd.gather(-1, da).squeeze(-1).clamp_(0.0, 1.0)


# Rows per block of a head's CPU scoring: 4–16 rows score within 10 % of each other on
# SmolLM2 (V = 49,152), 64 rows (the default chunk) 30 % slower.
HEAD_BLOCK_ROWS = 16


def _in_draft_vocab(dl: torch.Tensor, vocab: ScoringVocab) -> torch.Tensor:
    """A head's raw logits [N, Vd] -> the columns the scorer reads ([N, Vs])."""
    if vocab.keep is not None:
        return dl.index_select(1, vocab.keep.to(dl.device))
    if vocab.ids is None and dl.shape[-1] != vocab.vocab:
        return align_vocab(dl, vocab.vocab)  # the head's own LM head, another width
    return dl


def _emit(
    out: ChunkScores,
    d: int,
    sc: DepthScores,
    greedy: torch.Tensor,  # [N] p(argmax q)
    entropy: torch.Tensor,  # [N] the target's
    target_logits: torch.Tensor,  # [N, V]
    dl: torch.Tensor,  # [N, Vs]
    token_pos: torch.Tensor,  # [N]
    vocab: ScoringVocab,
    probes: Sequence[Probe],
    chunk: Chunk | None,
) -> None:
    """One depth's scores into `out` (depth 1: the row metrics, top-k, probes)."""
    if d == 1:
        got = {"accept_prob": sc.alpha, "accept_prob_greedy_draft": greedy, "greedy_agree": sc.agree, "kl_target_draft_nats": sc.kl.clamp_(min=0.0), "target_entropy_nats": entropy, "draft_confidence": sc.confidence}
        out.values = {f: got[f].float().cpu().numpy() for f in ROW_FIELDS}
        out.extra = {k: v.cpu().numpy() for k, v in (sc.top or {}).items()}
        if probes:  # they read [N, V] logits: the draft's mapped into the target vocabulary
            mapped = dl if vocab.ids is None else map_logits(dl, vocab.ids.to(dl.device), vocab.vocab)
            for probe in probes:
                assert chunk is not None
                out.extra.update(probe(chunk, target_logits, mapped))
            del mapped
        out.broken = _broken(list(out.values.values()), target_logits, dl, out.broken)
    else:
        _deeper(out, d, sc.alpha, sc.confidence, token_pos, dl, greedy)


def _deeper(out: ChunkScores, d: int, alpha: torch.Tensor, confidence: torch.Tensor, token_pos: torch.Tensor, dl: torch.Tensor, greedy: torch.Tensor) -> None:
    """A depth d > 1 into `out`: α and p(argmax q) (0 where the prediction would start
    before the sequence) and max q; each tensor [N], dl [N, V'] the depth's logits."""
    ok = (token_pos - d >= 0).float()  # the prediction was made inside the sequence
    out.alpha_by_depth[d] = (alpha * ok).cpu().numpy()
    out.greedy_by_depth[d] = (greedy.float() * ok).cpu().numpy()
    out.confidence_by_depth[d] = confidence.float().cpu().numpy()
    out.broken = _broken([out.alpha_by_depth[d], out.greedy_by_depth[d], out.confidence_by_depth[d]], None, dl, out.broken)


def _broken(values: list[np.ndarray], target_logits: torch.Tensor | None, draft_logits: torch.Tensor | None, seen: np.ndarray | None) -> np.ndarray | None:
    """Which side's logits are not numbers, where a metric came out NaN/inf (ChunkScores.broken).
    The [N, V] logits are read only for the rows of a chunk that has such a metric."""
    bad = np.zeros(len(values[0]), dtype=bool)
    for v in values:
        bad |= ~np.isfinite(v)
    if not bad.any():
        return seen
    out = seen if seen is not None else np.zeros(len(bad), dtype=np.int8)
    rows = np.flatnonzero(bad)
    for side, logits in ((1, target_logits), (2, draft_logits)):
        if logits is not None:
            x = logits[torch.as_tensor(rows, device=logits.device)]  # [n, V]
            hit = (x.isnan().any(-1) | x.isposinf().any(-1) | x.isneginf().all(-1)).cpu().numpy()
            out[rows[hit]] |= side
    out[rows[out[rows] == 0]] = 3  # the metrics overflowed though each side's logits are numbers
    return out


# ----------------------------------------------------------------------------- collectors
def _wants(sinks: Sequence[Collector]) -> tuple[int, list[Probe]]:
    """What the collectors ask of every chunk: the largest top-k (attribute `top_k`) and
    their probes (attribute `probe`); neither is part of the protocol's minimum."""
    top = max((int(getattr(s, "top_k", 0) or 0) for s in sinks), default=0)
    return top, [p for p in (getattr(s, "probe", None) for s in sinks) if p is not None]


def _tree_width(sinks: Sequence[Collector]) -> int:
    """The most tree candidates per depth a collector asks for (attribute `tree_width`)."""
    return max((int(getattr(s, "tree_width", 0) or 0) for s in sinks), default=0)


class SequenceCollector:
    """Feeds the accumulator one prompt's continuation at a time, and keeps the
    per-position rows (rounded to 6 digits) when asked."""

    def __init__(self, acc: Accumulator, prompts: Sequence[Prompt], keep_positions: bool) -> None:
        self.acc = acc
        self.prompts = prompts
        self.keep_positions = keep_positions
        self.rows: dict[str, list[Row]] = {k: [] for k in ("prompt_id", "domain", "position", *ROW_FIELDS)}
        self._pending: list[tuple[Chunk, ChunkScores]] = []
        # prompts left out because a side's logits were not numbers: one line each, and
        # how many positions
        self.nonfinite: list[str] = []
        self.nonfinite_positions = 0

    def chunk(self, chunk: Chunk, scores: ChunkScores) -> None:
        self._pending.append((chunk, scores))

    def batch_done(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        prompt = np.concatenate([c.prompt for c, _ in pending])
        positions = np.concatenate([c.token_pos for c, _ in pending])
        vals = {f: np.concatenate([s.values[f] for _, s in pending]) for f in ROW_FIELDS}
        alpha = {d: np.concatenate([s.alpha_by_depth[d] for _, s in pending]) for d in pending[0][1].alpha_by_depth}
        greedy = {d: np.concatenate([s.greedy_by_depth[d] for _, s in pending]) for d in pending[0][1].greedy_by_depth}
        conf = {d: np.concatenate([s.confidence_by_depth[d] for _, s in pending]) for d in pending[0][1].confidence_by_depth}
        broken = np.concatenate([s.broken if s.broken is not None else np.zeros(len(c.prompt), dtype=np.int8) for c, s in pending])
        for sl in _runs(prompt):
            p = self.prompts[int(prompt[sl.start])]
            if broken[sl].any():  # a prompt with NaN/inf logits is left out whole, and named
                self._left_out(p.id, positions[sl], broken[sl])
                continue
            seq = {f: v[sl] for f, v in vals.items()}
            self.acc.add_sequence(
                p.domain, positions[sl], seq,
                alpha_by_depth={d: a[sl] for d, a in alpha.items()} or None,
                confidence_by_depth={d: c[sl] for d, c in conf.items()} or None,
                category=p.category,
                greedy_by_depth={d: g[sl] for d, g in greedy.items()} or None,
            )
            if self.keep_positions:
                n = sl.stop - sl.start
                self.rows["prompt_id"].extend([p.id] * n)
                self.rows["domain"].extend([p.domain] * n)
                self.rows["position"].extend(positions[sl].tolist())
                for f in ROW_FIELDS:
                    self.rows[f].extend(np.round(seq[f], 6).tolist())


    def _left_out(self, prompt_id: str, positions: np.ndarray, broken: np.ndarray) -> None:
        at = positions[broken > 0].tolist()
        sides = " and ".join(name for bit, name in ((1, "target"), (2, "drafter")) if np.any(broken & bit))
        shown = ", ".join(str(x) for x in at[:8]) + (f" … ({len(at)} in all)" if len(at) > 8 else "")
        self.nonfinite.append(f"{prompt_id} position{'s' if len(at) > 1 else ''} {shown} ({sides} logits NaN/inf)")
        self.nonfinite_positions += len(at)


# ----------------------------------------------------------------------------- the batch loop
@dataclass
class Scored:
    acc: Accumulator
    rows: dict[str, list[Row]]
    interrupted: bool = False
    head_depths: tuple[int, ...] = ()  # depths a head drafter predicted directly (others chain depth 1)
    drill: DrillCollector | None = None  # the token-level drill-down collector, when one ran
    second_press: bool = False  # Ctrl-C came during the references and again during scoring
    memory_notes: list[str] = field(default_factory=list)  # what out-of-memory made smaller
    nonfinite: list[str] = field(default_factory=list)  # prompts left out: NaN/inf logits (SequenceCollector)
    nonfinite_positions: int = 0
    served_whatif: Any = None  # a side served quantized: the full-precision what-if's collector (probe.served), read by assemble
    tree: Any = None  # draft trees: the `metrics.tree.TreeAccumulator` (probe.tree), read by assemble
    remote: Any = None  # diagnose --target-server: (section, metrics left out) from `probe.remote`, read by assemble
    live: Any = None  # diagnose --against: (section, metrics, evidence) from `probe.live.compare`, read by assemble


def score(target: LoadedModel, drafter: Drafter, prompts: list[Prompt], encoded: list[list[int]], conts: list[list[int]], pair: SamplingPair, cfg: DiagnoseConfig, progress: Progress, collectors: Sequence[Collector] = ()) -> Scored:
    """Teacher-forced scoring in batches of similar length (prompts without a continuation
    are skipped). Ctrl-C keeps the batches finished so far (`Scored.interrupted`)."""
    acc = Accumulator(k_max=cfg.k_max, drafting=cfg.drafting, p_min=cfg.draft_p_min, n_min=cfg.draft_n_min,
                      threshold_single=cfg.accept_threshold_single, threshold_acc=cfg.accept_threshold_acc)
    sequences = SequenceCollector(acc, prompts, cfg.keep_positions)
    sinks: list[Collector] = [sequences, *collectors]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]) + len(conts[i]))
    order = [i for i in order if conts[i]]
    interrupted = False
    head_depths: tuple[int, ...] = ()
    with progress.task(f"scoring target vs drafter ({sum(len(conts[i]) for i in order)} positions)", len(order)) as advance:
        # chunk from the free memory; out of memory halves the chunk, then the batch (memory.py)
        backoff = Backoff(chunk_for(getattr(target, "vocab_size", 1), str(getattr(target, "device", "cpu")), cfg.chunk_positions))
        buffer = Buffered(sinks)  # a batch cut by out-of-memory reaches no collector

        def attempt(ix: list[int], chunk: int) -> tuple[int, ...]:
            buffer.drop()
            return score_batch(target, drafter, ix, encoded, conts, pair, replace(cfg, chunk_positions=chunk), [buffer])

        try:
            for start in range(0, len(order), cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                head_depths = backoff.run(idx, attempt, buffer.commit)[-1]
                advance(len(idx))
        except KeyboardInterrupt:
            interrupted = True
    for note in dict.fromkeys(backoff.notes):
        progress.note(note)
    return Scored(acc, sequences.rows, interrupted, head_depths, memory_notes=list(dict.fromkeys(backoff.notes)),
                  nonfinite=sequences.nonfinite, nonfinite_positions=sequences.nonfinite_positions)


def score_batch(target: LoadedModel, drafter: Drafter, idx: list[int], encoded: list[list[int]], conts: list[list[int]], pair: SamplingPair, cfg: DiagnoseConfig, sinks: Sequence[Collector]) -> tuple[int, ...]:
    """One target pass over prompts `idx` (prompt + continuation, right-padded), then
    chunk by chunk: logits -> `score_chunk` -> every collector. -> the head depths seen."""
    ids, mask = _right_padded([encoded[i] + conts[i] for i in idx], _pad_id(target.tokenizer), target.device)
    # position t = p0−1+j predicts continuation token j (at p0+j), for j < len(continuation)
    lengths = [len(conts[i]) for i in idx]
    t_np = np.concatenate([np.arange(len(encoded[i]) - 1, len(encoded[i]) - 1 + len(conts[i])) for i in idx])  # [P]
    prompt_of = np.repeat(np.asarray(idx), lengths)  # [P]
    rows = torch.from_numpy(np.repeat(np.arange(len(idx)), lengths)).to(ids.device)  # [P] batch row
    t = torch.from_numpy(t_np).to(ids.device)  # [P]
    head = target.head  # the LM head + the architecture's post-head transform (soft-capping, scaling)
    step = cfg.chunk_positions
    top, probes = _wants(sinks)
    width = _tree_width(sinks)
    keepers: list[Any] = [s for s in sinks if getattr(s, "wants_pass", False)]
    cache_out: list[Any] | None = [] if keepers else None  # a collector that starts from this pass keeps its KV cache
    with torch.inference_mode(), capture_layers(target.model, drafter.target_layers_needed()) as captured:
        # the model's own forward (logits for the last position only: they re-prove `head`)
        tp = TargetPass(ids, mask, target.last_hidden(ids, mask, cache_out=cache_out), dict(captured))
        feats = drafter.hidden(tp)  # depth -> [B, S, H']
        depths = sorted(d for d in feats if 1 <= d <= cfg.k_max)
        vocab: ScoringVocab | None = None
        draft_logits = drafter.logits
        if isinstance(drafter, HeadDrafter):  # logits over its own draft vocabulary, scored there (score_head_chunk)
            vocab, draft_logits = drafter.scoring_vocab(), drafter.draft_logits
        # a head that stops short of k_max (Medusa: one depth per head) drafts nothing
        # deeper: those depths are accepted with probability 0, not chained from depth 1
        beyond = range(max(depths, default=0) + 1, cfg.k_max + 1) if drafter.head_depths is not None else range(0)
        for c0 in range(0, rows.numel(), step):
            bb, tt = rows[c0 : c0 + step], t[c0 : c0 + step]  # [N]
            tl = head(tp.last_hidden[bb, tt])  # [N, V]
            # the depth-d prediction of token t+1 is made at position t+1−d
            drafts = ((d, draft_logits(feats[d][bb, (tt + 1 - d).clamp(min=0)], d)) for d in depths)  # [N, V'] each
            chunk = Chunk(prompt_of[c0 : c0 + step], t_np[c0 : c0 + step] + 1)
            passing, engine_conf = engine_confidence(drafts, cfg.confidence)
            tree_seen: dict[int, tuple[np.ndarray, np.ndarray]] = {}
            if width:
                passing, tree_seen = tree_passing(passing, tl, pair.target, width, vocab)
            scores = with_confidence(score_chunk(tl, passing, tt + 1, pair, top, probes, chunk, vocab), engine_conf)
            scores.tree = tree_seen
            for d in beyond:
                scores.alpha_by_depth[d] = np.zeros(len(chunk.prompt))
                scores.greedy_by_depth[d] = np.zeros(len(chunk.prompt))
                scores.confidence_by_depth[d] = np.zeros(len(chunk.prompt), dtype=np.float32)
                if width:
                    scores.tree[d] = (np.zeros((len(chunk.prompt), width)), np.zeros((len(chunk.prompt), width)))
            for s in sinks:
                s.chunk(chunk, scores)
            del tl
        for s in keepers:
            s.target_pass(idx, tp, cache_out[0] if cache_out else None)
    return tuple(d for d in depths if d > 1)


def _pad_id(tok: Any) -> int:
    return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)


def _right_padded(seqs: list[list[int]], pad: int, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> ids [B, S], attention mask [B, S], tokens at the left end."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
    return ids.to(device), mask.to(device)


