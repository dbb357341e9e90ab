"""The two halves of `diagnose --target-server` that talk to the server: its references
(`server_references`) and its teacher-forced scores beside the drafter's forward here
(`ServerScoring`), both kept per prompt in `remote_cache` as the server answers, so a
run stopped by Ctrl-C or by a server that went away continues where it stopped.

A server that stops answering (after the shared HTTP client's retries) ends the half it
was in: what it answered is kept, and the run returns what was scored as an interrupted
run does (or the error, when nothing was scored yet).

Widening (`--target-widen N`): a prompt with positions the top-n leaves loose (the
drafter's token not listed) is asked again with top-N, cut after its last loose
position, and those positions are scored from the wider answer; positions already exact
keep the first answer (the wider one could only repeat them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specprobe.core.errors import ConfigError, ServerError
from specprobe.core.progress import Progress
from specprobe.engines import GREEDY
from specprobe.engines.http import in_order
from specprobe.metrics.accumulate import Accumulator
from specprobe.metrics.remote import LEFT_OUT, Bounded, TopN, bounded_metrics
from specprobe.models.loader import cache_root
from specprobe.probe.chunks import ROW_FIELDS
from specprobe.probe.live import REQUEST_TIMEOUT_S
from specprobe.probe.remote_cache import RemoteCache, Rows, run_key
from specprobe.settings.pipeline import DiagnoseConfig


def open_cache(server: Any, cfg: DiagnoseConfig, encoded: Sequence[Sequence[int]], request: dict[str, Any], vocab: int, progress: Progress, seed: int | None = None) -> RemoteCache | None:
    """The cache of the server's answers to these ids (None with --no-cache): for the
    references, the prompts' ids with the sampling and seed sent; for the scores, the
    whole sequences scored (prompt + reference), whatever wrote them."""
    if not cfg.use_cache:
        return None
    key = run_key(server.engine.name, server.model, server.tokenizer_name, server.version, encoded, request, cfg.seed if seed is None else seed, cfg.max_new_tokens)
    return RemoteCache(cache_root() / "remote", key, len(encoded), vocab, cfg.max_new_tokens, progress.note)


def probe_logprobs(server: Any, encoded: Sequence[Sequence[int]], n: int) -> None:
    """One short scoring request with top-n: a server that caps logprobs below n says so
    now (a ConfigError naming its setting), before the references are written."""
    ids = next((list(e[:2]) for e in encoded if len(e) >= 2), None)
    if ids is not None:
        server.prompt_logprobs(ids, n, REQUEST_TIMEOUT_S)


@dataclass
class References:
    conts: list[list[int]]
    seconds: float = 0.0
    interrupted: bool = False
    stopped: ServerError | None = None  # the server stopped answering
    cached: int = 0


def server_references(server: Any, encoded: list[list[int]], cfg: DiagnoseConfig, request: dict[str, Any], cache: RemoteCache | None, progress: Progress, label: str, seed: int | None = None) -> References:
    """The server's on-policy references (the run's sampling, seed + i for prompt i; seed
    --seed by default), each kept as it arrives; those the cache has are not asked again."""
    seed = cfg.seed if seed is None else seed
    have = cache.references() if cache is not None else {}
    out = References([have.get(i, []) for i in range(len(encoded))], cached=len(have))
    todo = [i for i in range(len(encoded)) if i not in have]
    if have:
        progress.note(f"{len(have)} of {len(encoded)} references already written by the server (resumed from {cache.where() if cache else ''})")

    def ask(i: int) -> tuple[int, list[int]]:
        cont = server.complete(encoded[i], cfg.max_new_tokens, request, seed + i, timeout=REQUEST_TIMEOUT_S)
        if cache is not None:
            cache.add_reference(i, cont)
        return i, cont

    t0 = time.perf_counter()
    with progress.task(f"references from {label}", len(todo)) as advance:
        try:
            for i, cont in in_order(ask, todo):
                out.conts[i] = cont
                advance()
        except KeyboardInterrupt:
            out.interrupted = True
            progress.note(f"interrupted while the server wrote references: scoring the {sum(1 for c in out.conts if c)} prompts that have one")
        except ServerError as e:
            out.stopped = e
    out.seconds = time.perf_counter() - t0
    return out


def _cat(parts: list[Bounded]) -> Bounded:
    if len(parts) == 1:
        return parts[0]
    return Bounded({k: np.concatenate([b.low[k] for b in parts]) for k in parts[0].low},
                   {k: np.concatenate([b.high[k] for b in parts]) for k in parts[0].high},
                   np.concatenate([b.exact for b in parts]))


@dataclass
class ServerScoring:
    """The scoring half: per prompt, the server's top-n over prompt + reference and the
    drafter's logits here -> both ends of every position, into `low` and `high`."""

    server: Any
    cfg: DiagnoseConfig
    drafter: Any
    pair: Any
    cache: RemoteCache | None
    progress: Progress
    vocab: int | None = None  # the target's vocabulary (the tokenizer's), for T ∉ {0, 1}
    low: Accumulator = field(init=False)
    high: Accumulator = field(init=False)
    rows: dict[str, list[Any]] = field(init=False)
    _lock: Any = field(init=False, repr=False)
    positions: int = 0
    exact: int = 0
    requests: int = 0
    bytes: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0  # the loop here waiting on the server's answers
    asked_positions: int = 0  # positions the server scored in this run (not from the cache)
    resumed: int = 0  # prompts whose scores came from the cache
    interrupted: bool = False
    stopped: ServerError | None = None
    notes: list[str] = field(default_factory=list)
    widened: dict[str, Any] = field(default_factory=dict)
    chosen: bool = False  # ask the server for the drafter's argmax ids too (`remote.chosen_ids`)
    keep_bounds: bool = False  # keep each prompt's per-position ends in `bounds` (tests, benchmarks)
    bounds: dict[int, Bounded] = field(default_factory=dict)

    def __post_init__(self) -> None:
        c = self.cfg
        self.low, self.high = (Accumulator(k_max=c.k_max, drafting=c.drafting, p_min=c.draft_p_min, n_min=c.draft_n_min,
                                           threshold_single=c.accept_threshold_single, threshold_acc=c.accept_threshold_acc) for _ in range(2))
        self.rows = {k: [] for k in ("prompt_id", "domain", "position", *ROW_FIELDS)}
        self._lock = threading.Lock()  # the drafter runs in the request threads where `chosen`
        w = c.target_widen
        self.widened = {"logprobs": w, "prompts": 0, "positions": 0, "made_exact": 0, "requests": 0, "bytes": 0, "seconds": 0.0} if w else {}

    # ------------------------------------------------------------------ the server's side
    def _scores(self, ids: list[int], start: int, cont: list[int], n: int, pid: str, chosen: list[int] | None = None) -> tuple[Rows, int]:
        """The rows of cont's positions in ids (row k: the token at start + k), checked;
        `chosen`: token ids the server scores at every position beside the top-n."""
        got = self.server.prompt_logprobs(ids, n, REQUEST_TIMEOUT_S) if chosen is None else self.server.prompt_logprobs_chosen(ids, n, chosen, REQUEST_TIMEOUT_S)
        rows = got.rows[start - 1 : start - 1 + len(cont)]
        for j, (r, t) in enumerate(zip(rows, cont, strict=False)):
            if t not in r:
                raise ConfigError(f"the server's scores for prompt {pid} do not list the token sent at position {start + j} ({t})",
                                  "the server re-tokenised the prompt: check that it takes token ids (vLLM's /v1/completions does)")
        return rows, got.bytes

    # ------------------------------------------------------------------ the loop
    def run(self, prompts: Sequence[Any], encoded: list[list[int]], conts: list[list[int]]) -> None:
        cfg, n = self.cfg, self.cfg.target_logprobs
        order = [i for i in range(len(prompts)) if conts[i]]
        have = self.cache.scores(n, {i: len(conts[i]) for i in order}) if self.cache is not None else {}
        have = {i: r for i, r in have.items() if i in order and len(r) == len(conts[i])}
        self.resumed = len(have)
        if have:
            self.progress.note(f"{len(have)} of {len(order)} prompts already scored by the server (resumed from {self.cache.where() if self.cache else ''})")
        wide = self.cache.scores(cfg.target_widen, {i: len(conts[i]) for i in order}) if self.cache is not None and cfg.target_widen else {}

        def ask(i: int) -> tuple[Rows, int, torch.Tensor | None]:
            dl = chosen = None
            if self.chosen:  # the drafter first: its argmax is what the server scores
                dl = self._draft(encoded[i], conts[i])
                top = dl.argmax(-1).tolist()
                # kept answers serve only where they list this drafter's choice at every
                # position (another drafter's run kept its own ids)
                if i in have and all(t in r for t, r in zip(top, have[i], strict=False)):
                    return have[i], 0, dl
                chosen = sorted({t for t in top if self.vocab is None or t < self.vocab})
            elif i in have:
                return have[i], 0, None
            rows, size = self._scores(encoded[i] + conts[i], len(encoded[i]), conts[i], n, prompts[i].id, chosen)
            if self.cache is not None:
                self.cache.add_scores(i, n, rows)
            return rows, size, dl

        t0 = time.perf_counter()
        total = sum(len(conts[i]) for i in order)
        with self.progress.task(f"scoring {total} positions on the server", len(order)) as advance:
            try:
                answers = in_order(ask, order)
                for i in order:
                    w0 = time.perf_counter()
                    rows, size, dl = next(answers)
                    self.wait_s += time.perf_counter() - w0
                    if size:
                        self.requests, self.bytes, self.asked_positions = self.requests + 1, self.bytes + size, self.asked_positions + len(rows)
                    self._one(prompts[i], i, encoded[i], conts[i], rows, wide.get(i), dl)
                    advance()
            except KeyboardInterrupt:
                self.interrupted = True
                self.progress.note(f"interrupted: keeping the {self.low.num_prompts} prompts scored")
            except ServerError as e:
                self.stopped = e
        self.seconds = time.perf_counter() - t0
        if self.asked_positions and self.seconds > 0:
            per_min = self.asked_positions / self.seconds * 60
            self.progress.note(f"scored {self.asked_positions:,} positions on the server in {self.seconds:.1f} s: {per_min:,.0f} positions/min "
                               f"({self.wait_s:.1f} s of it waiting on the server's answers, the rest the drafter here)")

    def _draft(self, enc: list[int], cont: list[int]) -> torch.Tensor:
        """[n, V'] the drafter's logits predicting cont's tokens after enc."""
        with self._lock, torch.inference_mode():
            x = torch.tensor([enc + cont], device=self.drafter.device)
            hidden = self.drafter.last_hidden(x, torch.ones_like(x))
            return self.drafter.head(hidden[0, len(enc) - 1 : len(enc) - 1 + len(cont)]).float()

    def _one(self, p: Any, i: int, enc: list[int], cont: list[int], rows: Rows, wide: Rows | None, dl: torch.Tensor | None = None) -> None:
        cfg = self.cfg
        if dl is None:
            dl = self._draft(enc, cont)
        greedy = cfg.drafting == GREEDY
        b = bounded_metrics(TopN.from_rows(rows, cfg.target_logprobs), dl, self.pair.target, self.pair.draft, greedy_drafting=greedy, vocab=self.vocab)
        if cfg.target_widen and not b.exact.all():
            b = self._widen(p, i, enc, cont, dl, b, wide)
        if self.keep_bounds:
            self.bounds[i] = b
        pos = np.arange(len(enc), len(enc) + len(cont))
        self.low.add_sequence(p.domain, pos, b.low, category=p.category)
        self.high.add_sequence(p.domain, pos, b.high, category=p.category)
        self.exact += int(b.exact.sum())
        self.positions += len(cont)
        if cfg.keep_positions:
            self.rows["prompt_id"].extend([p.id] * len(cont))
            self.rows["domain"].extend([p.domain] * len(cont))
            self.rows["position"].extend(pos.tolist())
            for f in ROW_FIELDS:
                self.rows[f].extend([None] * len(cont) if f in LEFT_OUT else np.round(b.low[f], 6).tolist())

    def _widen(self, p: Any, i: int, enc: list[int], cont: list[int], dl: torch.Tensor, b: Bounded, wide: Rows | None) -> Bounded:
        """The prompt again with top-N, cut after its last loose position: those positions
        from the wider answer, the rest as they were."""
        cfg, w = self.cfg, self.widened
        n = cfg.target_widen
        last = int(np.flatnonzero(~b.exact).max()) + 1  # positions [0, last) from the wider answer
        if wide is None or len(wide) < last:
            t0 = time.perf_counter()
            wide, size = self._scores(enc + cont[:last], len(enc), cont[:last], n, p.id)
            w["requests"] += 1
            w["bytes"] += size
            w["seconds"] += time.perf_counter() - t0
            if self.cache is not None:
                self.cache.add_scores(i, n, wide)
        wide = wide[:last]
        greedy = cfg.drafting == GREEDY
        head = bounded_metrics(TopN.from_rows(wide, n), dl[:last], self.pair.target, self.pair.draft, greedy_drafting=greedy, vocab=self.vocab)
        loose = ~b.exact[:last]
        w["prompts"] += 1
        w["positions"] += int(loose.sum())
        w["made_exact"] += int((head.exact & loose).sum())
        tail = Bounded({k: v[last:] for k, v in b.low.items()}, {k: v[last:] for k, v in b.high.items()}, b.exact[last:])
        # the wider answer's ends lie within the first's; where the first was exact, keep it
        keep = b.exact[:last]
        for side, src in ((head.low, b.low), (head.high, b.high)):
            for k in side:
                side[k] = np.where(keep, src[k][:last], side[k])
        head.exact = head.exact | keep
        return _cat([head, tail])

    def extra(self) -> dict[str, Any]:
        """What the result's `remote` section adds from this half."""
        per_s = self.asked_positions / self.seconds if self.asked_positions and self.seconds > 0 else None
        out: dict[str, Any] = {"resumed_prompts": self.resumed, "server_wait_s": self.wait_s, "positions_per_s": per_s, "positions_per_min": per_s * 60 if per_s else None}
        if self.widened:
            out["widened"] = dict(self.widened)
        return out
