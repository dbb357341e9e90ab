"""The default scorer behind `core.position_metrics`: the compiled rows and the torch
blocks, whichever the dispatch table (`metrics.dispatch`) picks. The compiled rows take
logits on a CPU under untruncated sampling row by row in `metrics.kernel` (numba-compiled
rows: one read of each row, the metrics finished there; half-precision logits are copied
to float32 first); the torch ops below take everything else, and the rows the compiled
ones flag (NaN or +inf): the metrics of a chunk computed a few rows at a time, so that
every pass after the first over a row reads the CPU's L2 cache instead of main memory, in
as few passes as the algebra allows.

Per side and row: one max over the logits (taken per 256-wide segment, which is as cheap
as a plain max and gives argmax and top-k almost for free, below), one pass writing the
tempered, max-shifted logits x = (l − max l) / T, one exp, one sum z = Σ eˣ. Then
p log p and p log q need no [V] buffer of their own, since with e = eˣ

    Σ p log p = Σ e_p·x_p / z_p − log z_p,      Σ p log q = Σ e_p·x_q / z_p − log z_q,

(one product and one sum over both sides) and α = Σ min(p, q) = Σ min(e_p, e_q·z_p/z_q) / z_p
(one scale, one minimum, one sum). A greedy draft's acceptance p(argmax q) is one
probability per row, read after the loop from the drafter's argmax (below).

argmax and top-k: a row's top-k tokens lie in the k segments with the largest maxima,
so they are found among k × 256 logits gathered after the loop, and their probabilities
are recomputed from those logits; the reference's `torch.topk` over the whole row costs
more than all the rest together. Truncating sampling (top-k/top-p/min-p) materialises p and q in the
block and runs the engine's transform (`sampling.truncate_`) on them.

Threads: with more than one torch thread each thread takes whole blocks, its ops
single-threaded (an op split across cores ends in a barrier, and a 1-row block's ops are
small); SPECPROBE_METRICS_THREADS=0 splits every op instead.

Each row's numbers are the reference's (`core.position_metrics_reference`) up to float
rounding (tested to 1e-5); ties among equal logits may pick another (equally maximal) id."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from specprobe.metrics.dispatch import Scorer, case, compiled_rows, pick
from specprobe.metrics.sampling import LOGQ_FLOOR, Sampling, truncate_

# [rows, V] float32 arrays a block keeps in cache: each side's logits (read twice), x and e
_ARRAYS = 6
_FALLBACK_CACHE = 2 * 1024 * 1024  # bytes of L2 per core when sysfs does not say
_SEGMENTS = (256, 128, 64, 32)  # segment widths tried, widest first (must divide V)


@lru_cache(maxsize=1)
def l2_bytes() -> int:
    """L2 cache per core (bytes), from sysfs; SPECPROBE_L2_BYTES overrides."""
    env = os.environ.get("SPECPROBE_L2_BYTES", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in sorted(os.listdir(base)):
            with open(f"{base}/{idx}/level") as f:
                if f.read().strip() != "2":
                    continue
            with open(f"{base}/{idx}/size") as f:
                s = f.read().strip().upper()
            return int(s.rstrip("KMB")) * {"K": 1024, "M": 1024 * 1024}.get(s.rstrip("B")[-1:], 1)
    except (OSError, ValueError):
        pass
    return _FALLBACK_CACHE


def block_rows(v: int, device: torch.device, n: int) -> int:
    """Rows per block. On a CPU as many as keep a block's arrays inside one core's L2
    cache (each core works through blocks of its own, `blocked_metrics`), at least 1;
    on other devices the whole chunk (a GPU gains nothing from host-cache blocking and
    loses to per-block launches)."""
    if device.type != "cpu":
        return max(n, 1)
    return max(1, l2_bytes() // (_ARRAYS * 4 * v))


def segment(v: int) -> int:
    """Segment width for the per-segment maxima: the widest of 256…32 dividing V, else V."""
    return next((c for c in _SEGMENTS if v % c == 0 and v // c >= 8), v)


class _Scratch:
    """Reusable float32 buffers per thread, grown on demand: allocating (and faulting in)
    fresh ones per block would cost more than the arithmetic."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.x = self.e = torch.empty(0)
        self._views: dict[int, tuple[torch.Tensor, ...]] = {}

    def get(self, rows: int, v: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        stale = self.x.is_inference() and not torch.is_inference_mode_enabled()  # made under inference mode: read-only outside it
        if self.key is None or self.key[1:] != (v, device) or self.key[0] < rows or stale:
            # [rows, 2, V]: side 0 the target, side 1 the drafter
            self.x, self.e = (torch.empty((rows, 2, v), dtype=torch.float32, device=device) for _ in range(2))
            self.key = (rows, v, device)
            self._views = {}
        return self.x, self.e

    def views(self, b: int) -> tuple[torch.Tensor, ...]:
        """x, e (first b rows) and their per-side views x0, x1, e_p ([b, 1, V]), e0, e1."""
        got = self._views.get(b)
        if got is None:
            x, e = self.x[:b], self.e[:b]
            got = self._views[b] = (x, e, x[:, 0], x[:, 1], e[:, :1], e[:, 0], e[:, 1])
        return got


_TLS = threading.local()
_POOL: dict[str, Any] = {"n": 0, "pool": None, "pid": 0}


def worker_pool(workers: int) -> ThreadPoolExecutor:
    """The metrics' worker threads (shared with head scoring in `scoring`): blocks of torch
    ops side by side, each op on one core, or shares of the compiled rows (`blocked_metrics`).
    Made again in a forked child, whose copy of the pool has no threads behind it."""
    if _POOL["n"] != workers or _POOL["pid"] != os.getpid():
        if _POOL["pool"] is not None and _POOL["pid"] == os.getpid():
            _POOL["pool"].shutdown(wait=False)
        _POOL.update(n=workers, pid=os.getpid(), pool=ThreadPoolExecutor(workers, thread_name_prefix="specprobe-metrics"))
    pool: ThreadPoolExecutor = _POOL["pool"]
    return pool


def on_workers(work: Callable[[list[int]], None], items: list[int], workers: int) -> None:
    """work(share) for each share of `items` (item i in share i mod workers), each share on
    one of the metrics' worker threads; returns once all are done. Autograd and inference
    mode are per thread in torch: every share runs under the caller's."""
    modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())

    def run(share: list[int]) -> None:
        with torch.inference_mode(modes[0]), torch.set_grad_enabled(modes[1]):
            work(share)

    jobs = [worker_pool(workers).submit(run, items[w::workers]) for w in range(min(workers, len(items)))]
    for j in jobs:
        j.result()


def _scratch() -> _Scratch:
    s = getattr(_TLS, "s", None)
    if s is None:
        s = _TLS.s = _Scratch()
    return s


def _temperature(s: Sampling) -> float:
    """The temperature each side's p (KL, entropy, α) uses: 1 when greedy."""
    return 1.0 if s.greedy else float(s.temperature)


class _Chunk:
    """Per-chunk state: per-segment maxima, shifts, sums and dot products of every row."""

    def __init__(self, tl: torch.Tensor, dl: torch.Tensor, ts: Sampling, ds: Sampling) -> None:
        n, v = tl.shape
        dev = tl.device
        self.tl, self.dl, self.ts, self.ds = tl, dl, ts, ds
        self.c = segment(v)
        self.inv_t = (1.0 / _temperature(ts), 1.0 / _temperature(ds))
        self.neg_inv_t = torch.tensor([-self.inv_t[0], -self.inv_t[1]], device=dev)  # [2]
        self.seg = torch.empty((n, 2, v // self.c), dtype=tl.dtype, device=dev)  # per-segment maxima
        self.shift = torch.empty((n, 2), device=dev)  # −max / T per side: x = l / T + shift
        self.z = torch.empty((n, 2), device=dev)  # Σ eˣ per side
        self.dots = torch.empty((n, 2), device=dev)  # Σ e_p·x_p, Σ e_p·x_q (x_q floored)
        self.alpha = torch.empty(n, device=dev)  # Σ min(p, q) when computed in the blocks
        # p(argmax q) under the target's truncation (made here: blocks run on several threads)
        self.greedy_draft = torch.empty(n, device=dev) if ts.truncates and not ts.greedy else None
        # max q, when the drafter truncates (made here: blocks run on several threads)
        self.conf = torch.empty(n, device=dev) if ds.truncates and not ds.greedy else None
        # floor log q at LOGQ_FLOOR and the target's −inf x at a finite number (set once a
        # −inf q meets p, or a −inf target logit makes 0·−inf): a finite sum, not inf/NaN
        self.floor_logq = False
        self.truncating = (ts.truncates and not ts.greedy) or (ds.truncates and not ds.greedy)
        self.tops: torch.Tensor | None = None  # [2, N, k] top ids per side, when the compiled rows found them
        self.done: dict[str, torch.Tensor] | None = None  # the metrics, when the compiled rows finished every row
        self.both_sample = not ts.greedy and not ds.greedy

    def _split(self, rows: int) -> None:
        """Every block's views of the logits and of the per-chunk arrays, made in one go
        (a view made per block costs more than a block's small ops on a 1-row block)."""
        n, v = self.tl.shape
        segs = v // self.c
        parts = (self.tl, self.dl, self.tl.view(n, segs, self.c), self.dl.view(n, segs, self.c), self.seg, self.seg[:, 0], self.seg[:, 1],
                 self.shift, self.shift[:, :1], self.shift[:, 1:], self.z, self.z[:, :1], self.z[:, 1:], self.dots, self.dots[:, 1], self.alpha)
        self.views = list(zip(*(t.split(rows) for t in parts), strict=True))
        self.rows = rows

    def block(self, k: int, sv: tuple[torch.Tensor, ...], check: bool = False) -> None:
        """Block k (rows k·rows …), with sv the scratch's views for its size
        (`_Scratch.views`). `check`: look for q = 0 under p > 0 (−inf drafter logits) in
        this block and, if so, floor log q from here on."""
        tl, dl, tls, dls, seg, seg0, seg1, sh, sh0, sh1, z, z0, z1, dots, dots1, alpha = self.views[k]
        x, e, x0, x1, ep, e0, e1 = sv
        torch.amax(tls, -1, out=seg0)  # per-segment maxima: the one read from DRAM
        torch.amax(dls, -1, out=seg1)
        torch.mul(seg.amax(-1), self.neg_inv_t, out=sh)  # [b, 2]: −max / T
        torch.add(sh0, tl, alpha=self.inv_t[0], out=x0)  # x = l/T − max/T
        torch.add(sh1, dl, alpha=self.inv_t[1], out=x1)
        torch.exp(x, out=e)
        torch.sum(e, -1, out=z)  # [b, 2]
        if self.floor_logq:
            x1.clamp_(min=z1.log().add_(LOGQ_FLOOR))
            x0.clamp_(min=-3.0e38)  # e_p = 0 there: the term is 0 (NaN logits stay NaN)
        torch.sum(x.mul_(ep), -1, out=dots)  # Σ e_p·x per side; x is free after this
        if check and not self.floor_logq and not bool(torch.isfinite(dots).all()):
            self.floor_logq = True
            self.block(k, sv)
            return
        if self.truncating:
            r = slice(k * self.rows, k * self.rows + tl.shape[0])
            self._truncated(r, e, z)
        elif self.both_sample:
            # α = Σ min(e_p, e_q·z_p/z_q) / z_p (divided by z_p after the loop); with a
            # greedy side α is one probability per row, read after the loop
            e1.mul_(z0 / z1)
            torch.sum(torch.minimum(e0, e1, out=x0), -1, out=alpha)

    def run(self, rows: int, workers: int = 1) -> None:
        """Every block, spread over `workers` threads (block i to worker i mod workers);
        then, once more with log q floored, the blocks whose Σ p log p or Σ p log q came
        out infinite or NaN (q = 0 where p > 0: −inf drafter logits; 0·−inf: −inf target
        logits; or logits that are not numbers, which stay NaN)."""
        self._split(rows)
        blocks = list(range(len(self.views)))
        if workers > 1 and len(blocks) > 1:
            on_workers(lambda share: self._blocks(share, True), blocks, workers)  # block 0, the one checked, is in share 0
        else:
            self._blocks(blocks, True)
        bad = ~torch.isfinite(self.dots).all(-1)
        if bool(bad.any()):
            self.floor_logq = True
            self._blocks(sorted({j // rows for j in bad.nonzero().flatten().tolist()}), False)

    def run_compiled(self, workers: int = 1, top: int = 0) -> None:
        """Every row through the compiled rows (`metrics.kernel`), rows dealt to `workers`
        threads in turn; rows it flags (NaN or +inf logits, or all −inf) then go through
        the torch ops one row at a time, as `run` does them. A compile failure falls back
        to `run` for the whole chunk (and switches the compiled rows off)."""
        kernel = compiled_rows()
        assert kernel is not None
        n = self.tl.shape[0]
        if n == 0:
            return
        tl, dl = self.tl.detach().numpy(), self.dl.detach().numpy()
        bad = np.zeros(n, dtype=np.uint8)
        tops = torch.empty((2, n, max(top, 1)), dtype=torch.int64)  # each side's top ids (argmax first)
        res = torch.empty((6, n))  # α, agreement, KL, entropy, max q, p(argmax q)
        probs = torch.empty((4, n, top))
        out = {"seg": self.seg.numpy(), "shift": self.shift.numpy(), "z": self.z.numpy(), "dots": self.dots.numpy(), "alpha": self.alpha.numpy(), "bad": bad, "tops": tops.numpy(), "res": res.numpy(), "probs": probs.numpy()}
        greedy = (self.ts.greedy, self.ds.greedy)

        def rows(r: np.ndarray) -> None:
            kernel.run_rows(tl, dl, r, self.c, self.inv_t, greedy, out)

        try:
            if workers > 1 and n > 1:
                # the calling thread takes the first share itself: handing the GIL back and
                # forth with a pool thread that only waits costs up to a switch interval (5 ms)
                shares = [np.arange(w, n, workers) for w in range(min(workers, n))]
                jobs = [worker_pool(workers).submit(rows, r) for r in shares[1:]]
                rows(shares[0])
                for j in jobs:
                    j.result()
            else:
                rows(np.arange(n))
        except Exception:  # a compile/toolchain failure: the torch ops (kernel is now off)
            self.run(block_rows(self.tl.shape[1], self.tl.device, n), workers)
            return
        flagged = np.flatnonzero(bad).tolist()
        # rows whose ids the compiled rows left out (flagged, or under k logits above −inf)
        redo = sorted(set(flagged) | set(np.flatnonzero((tops < 0).any(-1).any(0).numpy()).tolist()))
        if redo:
            r = torch.tensor(redo)
            for side in (0, 1):
                tops[side, r] = self.topk(side, tops.shape[-1], r)
        self.tops = tops
        if not redo:  # every row finished in the compiled rows: `blocked_metrics` returns these
            self.done = dict(zip(("alpha", "agree", "kl", "entropy", "confidence", "greedy_draft"), res, strict=True))
            if top:
                self.done.update(top_target_ids=tops[0], top_draft_ids=tops[1], top_target_probs=probs[0], top_draft_probs=probs[1], top_target_probs_at_draft=probs[2], top_draft_probs_at_target=probs[3])
        if flagged:
            self._split(1)
            self._blocks(flagged, False)
            self.floor_logq = True  # as `run` does: finite where the logits are numbers
            self._blocks([r for r in flagged if not bool(torch.isfinite(self.dots[r]).all())], False)

    def _blocks(self, blocks: list[int], check: bool) -> None:
        n, v = self.tl.shape
        scratch = _scratch()
        scratch.get(min(self.rows, n), v, self.tl.device)
        for k in blocks:
            self.block(k, scratch.views(self.views[k][0].shape[0]), check=check and k == 0)

    def _truncated(self, r: slice, e: torch.Tensor, z: torch.Tensor) -> None:
        """α, p(argmax q) (and max q) under the engines' truncation: p and q materialised in e."""
        ts, ds = self.ts, self.ds
        e.div_(z[..., None])
        ps = None if ts.greedy else truncate_(e[:, 0], ts)
        qs = None if ds.greedy else truncate_(e[:, 1], ds)
        if qs is not None and self.conf is not None:
            self.conf[r] = qs.amax(-1)
        if ps is not None and self.greedy_draft is not None:
            self.greedy_draft[r] = ps.gather(-1, self.argmax(1, r)[:, None]).squeeze(-1)
        if ps is not None and qs is not None:
            self.alpha[r] = torch.minimum(ps, qs).sum(-1)
        elif qs is not None:
            self.alpha[r] = qs.gather(-1, self.argmax(0, r)[:, None]).squeeze(-1)
        elif ps is not None:
            self.alpha[r] = ps.gather(-1, self.argmax(1, r)[:, None]).squeeze(-1)

    def argmax(self, side: int, r: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        """[rows] argmax of one side's logits: the first segment holding the max, then the
        first max inside it (so the first maximal id, as `torch.argmax`)."""
        if self.tops is not None and isinstance(r, slice) and r == slice(None):
            return self.tops[side, :, 0]
        logits, c = (self.tl, self.dl)[side][r], self.c
        if c == logits.shape[-1]:
            return logits.argmax(-1)
        n = logits.shape[0]
        si = self.seg[r, side].argmax(-1)  # [n]
        inside = logits.view(n, logits.shape[-1] // c, c)[torch.arange(n, device=logits.device), si].argmax(-1)  # [n]
        return si * c + inside

    def topk(self, side: int, k: int, r: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        """[rows, k] ids of one side's k largest logits, largest first."""
        if self.tops is not None and isinstance(r, slice) and r == slice(None) and k <= self.tops.shape[-1]:
            return self.tops[side, :, :k]
        logits, c = (self.tl, self.dl)[side][r], self.c
        n, v = logits.shape
        if k * c >= v:
            return torch.topk(logits, k, dim=-1).indices
        si = torch.topk(self.seg[r, side], k, dim=-1).indices  # [n, k] segments holding the top k
        cand = logits.view(n, logits.shape[-1] // c, c)[torch.arange(n, device=logits.device)[:, None], si].reshape(n, k * c)
        pos = torch.topk(cand, k, dim=-1).indices  # [n, k] in the candidates
        return si.gather(-1, pos // c) * c + pos % c

    def prob(self, side: int, ids: torch.Tensor) -> torch.Tensor:
        """[n, k] untruncated tempered probability of `ids` ([n, k]) on one side, computed
        from the logits as the blocks compute eˣ / z."""
        logits = (self.tl, self.dl)[side]
        x = torch.add(self.shift[:, side : side + 1], logits.gather(-1, ids), alpha=self.inv_t[side])
        return x.exp_().div_(self.z[:, side : side + 1])


def blocked_metrics(tl: torch.Tensor, dl: torch.Tensor, ts: Sampling, ds: Sampling, top: int = 0, rows: int | None = None, scorer: Scorer | None = None) -> dict[str, torch.Tensor]:
    """[N, V] target and drafter logits (same vocabulary) -> the metrics as [N] float32
    tensors: alpha, greedy_draft (p of the drafter's argmax), agree, kl, entropy,
    confidence (unclamped); with `top`, also
    top_{target,draft}_{ids,probs} and top_target_probs_at_draft /
    top_draft_probs_at_target [N, top]. scorer: ROWS or BLOCKS, as the dispatch table
    picked them (None: picked here, between the two). `rows`: rows per block of the torch
    ops, which then take the chunk (default `block_rows`)."""
    n, v = tl.shape
    if dl.dtype != tl.dtype:  # one dtype for the per-segment maxima of both sides
        common = torch.promote_types(tl.dtype, dl.dtype)
        tl, dl = tl.to(common), dl.to(common)
    if rows is not None:
        scorer = Scorer.BLOCKS
    elif scorer is None:
        scorer = pick(case(tl, dl, ts, ds), among=(Scorer.ROWS, Scorer.BLOCKS)).scorer
    if scorer is Scorer.ROWS and tl.dtype in (torch.bfloat16, torch.float16):
        # half-precision logits on a CPU (--dtype bfloat16): one float32 copy for the
        # compiled rows beats the torch ops on the halves
        tl, dl = tl.float(), dl.float()
    tl, dl = tl.contiguous(), dl.contiguous()  # rows viewed as segments
    ch = _Chunk(tl, dl, ts, ds)
    step = rows or block_rows(v, tl.device, n)
    threads = torch.get_num_threads()
    on_worker = threading.current_thread().name.startswith("specprobe-metrics")  # never wait on our own pool
    if scorer is Scorer.ROWS:
        if on_worker or threads == 1:
            ch.run_compiled(1, top)
            return ch.done or _finish(ch, top)
        # No OpenMP region of torch's from here to the end (small ops, one thread): after
        # one, torch's idle OpenMP threads spin for a while on the very cores the rows'
        # threads need (measured: a 2-thread run no faster than 1 right after a torch sum)
        torch.set_num_threads(1)
        try:
            ch.run_compiled(threads, top)
            return ch.done or _finish(ch, top)
        finally:
            torch.set_num_threads(threads)
    if tl.device.type == "cpu" and threads > 1 and n > step and not on_worker and os.environ.get("SPECPROBE_METRICS_THREADS", "1") != "0":
        # Each block's ops are small: split across cores inside every op, each op ends in a
        # barrier that waits for the slowest core (on a busy machine, for a time slice).
        # Instead every core takes whole blocks of its own, its ops single-threaded.
        torch.set_num_threads(1)
        try:
            ch.run(step, workers=threads)
        finally:
            torch.set_num_threads(threads)
    else:
        ch.run(step)
    return _finish(ch, top)


def _finish(ch: _Chunk, top: int) -> dict[str, torch.Tensor]:
    """The metrics from a chunk's per-row maxima, shifts, sums and dot products."""
    ts, ds = ch.ts, ch.ds
    z, logz = ch.z, ch.z.log()
    plogp = ch.dots[:, 0] / z[:, 0] - logz[:, 0]
    plogq = ch.dots[:, 1] / z[:, 0] - logz[:, 1]  # weights e_p: divided by z_p
    ta, da = ch.argmax(0), ch.argmax(1)
    agree = (ta == da).float()
    out = {"kl": plogp - plogq, "entropy": -plogp, "agree": agree}
    if ts.greedy:
        out["greedy_draft"] = agree.clone()
    elif ch.greedy_draft is not None:
        out["greedy_draft"] = ch.greedy_draft
    else:  # p of the drafter's token, untruncated
        out["greedy_draft"] = ch.prob(0, da[:, None])[:, 0]
    if ts.greedy and ds.greedy:
        out["alpha"] = agree.clone()
    elif ch.truncating:
        out["alpha"] = ch.alpha
    elif ts.greedy:  # q of the target's token
        out["alpha"] = ch.prob(1, ta[:, None])[:, 0]
    elif ds.greedy:  # p of the drafter's token
        out["alpha"] = ch.prob(0, da[:, None])[:, 0]
    else:
        out["alpha"] = ch.alpha / z[:, 0]
    if ds.greedy:
        out["confidence"] = torch.ones_like(plogp)
    else:
        out["confidence"] = ch.conf if ch.conf is not None else 1.0 / z[:, 1]  # max q = e⁰ / z
    if top:
        ti, di = ch.topk(0, top), ch.topk(1, top)
        out.update(top_target_ids=ti, top_draft_ids=di, top_target_probs=ch.prob(0, ti), top_draft_probs=ch.prob(1, di), top_target_probs_at_draft=ch.prob(0, di), top_draft_probs_at_target=ch.prob(1, ti))
    return out
