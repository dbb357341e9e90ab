"""Every scorer equals the eager reference (`core.position_metrics_reference`) to 1e-5:
the default, computed in cache-sized row blocks (`metrics.blocked`), for every sampling
case, block size, vocabulary shape and dtype; the fused formula (run uncompiled), and the
compiled function when SPECPROBE_TEST_COMPILE=1 (a CPU compile takes minutes here;
benchmarks/gpu_check.sh sets it); a failing compiler falls back to eager."""

from __future__ import annotations

import os

import pytest
import torch

from specprobe.metrics import blocked, core
from specprobe.metrics.sampling import Sampling

FIELDS = ("accept_prob", "accept_prob_greedy_draft", "greedy_agree", "kl_target_draft_nats", "target_entropy_nats", "draft_confidence")


def _logits(n: int = 24, v: int = 300, draft_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tl = torch.randn(n, v, generator=g) * 3
    dl = tl[:, : draft_v or v] + torch.randn(n, draft_v or v, generator=g)
    return tl, dl


CASES = [(Sampling(temperature=0.7), Sampling(temperature=0.7)), (Sampling(temperature=0.0), Sampling(temperature=1.0)), (Sampling(temperature=1.3), Sampling(temperature=0.0)), (Sampling(temperature=0.0), Sampling(temperature=0.0))]


@pytest.mark.parametrize("ts,ds", CASES)
def test_fused_formula_equals_eager(ts: Sampling, ds: Sampling) -> None:
    for draft_v in (None, 280):  # same vocabulary, and a drafter missing the last ids
        tl, dl = _logits(draft_v=draft_v)
        eager = core.position_metrics_reference(tl, dl, ts, ds, top=5)
        out = core._fused_body(tl, core.align_vocab(dl, tl.shape[-1]), 1.0 if ts.greedy else ts.temperature, 1.0 if ds.greedy else ds.temperature, ts.greedy, ds.greedy, 5)
        for f, got in zip(FIELDS, (out[0], out[-1], *out[1:5]), strict=True):
            want = getattr(eager, f)
            got = got.clamp(0.0, 1.0) if f.startswith("accept_prob") else got.clamp(min=0.0) if f.startswith("kl") else got
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f)
        assert eager.top is not None and torch.equal(out[5], eager.top["target_ids"]) and torch.equal(out[7], eager.top["draft_ids"])


def test_truncating_sampling_and_a_broken_compiler_take_the_eager_path(monkeypatch: pytest.MonkeyPatch) -> None:
    tl, dl = _logits()
    s = Sampling(temperature=0.8, top_p=0.9)
    monkeypatch.setitem(core._FUSED, "fn", lambda *a: (_ for _ in ()).throw(AssertionError("compiled path used")))
    monkeypatch.setitem(core._FUSED, "broken", None)
    eager = core.position_metrics(tl, dl, s, s)
    torch.testing.assert_close(core.position_metrics_fused(tl, dl, s, s).accept_prob, eager.accept_prob)

    def boom(*_a: object) -> None:
        raise RuntimeError("inductor: no C++ compiler")

    monkeypatch.setitem(core._FUSED, "fn", boom)
    t = Sampling(temperature=0.8)
    eager = core.position_metrics(tl, dl, t, t)
    torch.testing.assert_close(core.position_metrics_fused(tl, dl, t, t).accept_prob, eager.accept_prob)
    assert "no C++ compiler" in core._FUSED["broken"] and not core.fused_available()
    monkeypatch.setenv("SPECPROBE_FUSED", "1")  # asked for, but broken: scoring stays eager
    monkeypatch.setitem(core._FUSED, "fn", lambda *a: (_ for _ in ()).throw(AssertionError("compiled path used")))
    torch.testing.assert_close(core.position_metrics(tl, dl, t, t).accept_prob, eager.accept_prob)


@pytest.mark.skipif(os.environ.get("SPECPROBE_TEST_COMPILE") != "1", reason="a torch.compile of the scorer takes minutes on this CPU; set SPECPROBE_TEST_COMPILE=1")
def test_compiled_scorer_equals_eager() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tl, dl = (x.to(dev) for x in _logits(n=64, v=4096))
    for ts, ds in CASES[:2]:
        fused = core.position_metrics_fused(tl, dl, ts, ds, top=5)
        assert core.fused_available(), core._FUSED["broken"]
        eager = core.position_metrics_reference(tl, dl, ts, ds, top=5)
        for f in FIELDS:
            torch.testing.assert_close(getattr(fused, f), getattr(eager, f), atol=1e-5, rtol=1e-5, msg=f)


# ----------------------------------------------------------------------------- blocked default
TRUNCATING = [Sampling(temperature=0.8, top_p=0.9), Sampling(temperature=0.9, top_k=20, min_p=0.05, semantics="sglang"), Sampling(temperature=1.1, top_k=7, top_p=0.8, semantics="transformers")]
ALL_CASES = CASES + [(t, Sampling(temperature=0.7)) for t in TRUNCATING] + [(Sampling(temperature=0.7), d) for d in TRUNCATING] + [(Sampling(temperature=0.0), TRUNCATING[0]), (TRUNCATING[1], Sampling(temperature=0.0))]


def _assert_same(got: core.PositionMetrics, want: core.PositionMetrics, tops: bool = True) -> None:
    for f in FIELDS:
        torch.testing.assert_close(getattr(got, f), getattr(want, f), atol=1e-5, rtol=1e-5, msg=f)
    if tops:
        assert got.top is not None and want.top is not None and got.top.keys() == want.top.keys()
        for k, v in want.top.items():
            torch.testing.assert_close(got.top[k], v, atol=1e-6, rtol=1e-5, msg=k)


@pytest.mark.parametrize("ts,ds", ALL_CASES)
@pytest.mark.parametrize("v", [300, 512])  # 300: no 32-wide segments (plain argmax/top-k); 512: 16 segments of 32
def test_blocked_default_equals_reference(ts: Sampling, ds: Sampling, v: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROBE_SCORER", "torch")  # the torch-op blocks (the compiled rows: tests/test_kernel.py)
    for draft_v in (None, v - 20):  # same vocabulary, and a drafter missing the last ids
        tl, dl = _logits(n=23, v=v, draft_v=draft_v)
        want = core.position_metrics_reference(tl, dl, ts, ds, top=5)
        for rows in (1, 4, 23, 64):  # one row per block, a ragged last block, one block, more than N
            monkeypatch.setattr(blocked, "block_rows", lambda *_a, rows=rows: rows)
            _assert_same(core.position_metrics(tl, dl, ts, ds, top=5), want)
        assert core.position_metrics(tl, dl, ts, ds).top is None
    empty = core.position_metrics(tl[:0], dl[:0], ts, ds, top=5)  # a chunk with no positions
    assert empty.accept_prob.shape == (0,) and empty.top is not None and empty.top["target_ids"].shape == (0, 5)


def test_blocked_floors_log_q_in_the_rows_that_need_it() -> None:
    """−inf drafter logits (a head's vocabulary mapped into the target's) only in rows the
    first block does not hold: those rows get the reference's finite KL, the others stay
    untouched; NaN/inf logits stay NaN in the metrics (scoring names those positions)."""
    tl, dl = _logits(n=20, v=512)
    dl[9, 5:60] = float("-inf")
    dl[17, 100:] = float("-inf")
    s = Sampling(temperature=0.7)
    want = core.position_metrics_reference(tl, dl, s, s, top=3)
    for rows in (1, 3, 8):
        got = blocked.blocked_metrics(tl, dl, s, s, top=3, rows=rows)
        assert torch.isfinite(got["kl"]).all()
        torch.testing.assert_close(got["kl"].clamp(min=0.0), want.kl_target_draft_nats, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["alpha"], want.accept_prob, atol=1e-5, rtol=1e-5)
    tl[3, 7], dl[12, 0], tl[15] = float("nan"), float("inf"), float("-inf")
    got = core.position_metrics(tl, dl, s, s)
    bad = ~torch.isfinite(got.kl_target_draft_nats)
    assert bad.nonzero().flatten().tolist() == [3, 12, 15]


def test_blocked_argmax_and_top_k_are_the_first_maximal_ids() -> None:
    """Per-segment maxima find argmax and top-k: a maximum repeated in two segments, or
    twice in one, gives the first id, as torch.argmax does; top-k across segments."""
    tl = torch.zeros(3, 512)
    tl[0, [40, 300]] = 5.0  # two segments
    tl[1, [33, 34]] = 5.0  # one segment
    tl[2, [1, 100, 200, 300, 400, 500]] = torch.tensor([1.0, 6.0, 2.0, 5.0, 4.0, 3.0])
    g = Sampling(temperature=0.0)
    pm = core.position_metrics(tl, tl.clone(), g, g, top=4)
    assert pm.top is not None
    assert pm.top["target_ids"][2].tolist() == [100, 300, 400, 500]
    ch = blocked._Chunk(tl, tl, g, g)
    ch.run(3)
    assert ch.argmax(0).tolist() == [40, 33, 100] == tl.argmax(-1).tolist()


def test_blocked_upcasts_half_precision_logits() -> None:
    tl, dl = _logits(n=12, v=512)
    s = Sampling(temperature=0.7)
    for dt in (torch.bfloat16, torch.float16):
        got = core.position_metrics(tl.to(dt), dl.to(dt), s, s, top=5)
        want = core.position_metrics_reference(tl.to(dt), dl.to(dt), s, s, top=5)
        _assert_same(got, want, tops=False)
        # half-precision logits tie often: the top probabilities agree, the ids among ties may not
        assert got.top is not None and want.top is not None
        for k in ("target_probs", "draft_probs"):
            torch.testing.assert_close(got.top[k], want.top[k], atol=1e-6, rtol=1e-5, msg=k)
    mixed = core.position_metrics(tl.to(torch.bfloat16), dl, s, s)
    _assert_same(mixed, core.position_metrics_reference(tl.to(torch.bfloat16), dl, s, s), tops=False)


def test_block_rows_fit_the_l2_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    blocked.l2_bytes.cache_clear()
    monkeypatch.setenv("SPECPROBE_L2_BYTES", str(2 * 1024 * 1024))
    try:
        assert blocked.l2_bytes() == 2 * 1024 * 1024
        # six float32 [rows, V] arrays per block in one core's L2
        assert blocked.block_rows(32_000, torch.device("cpu"), 64) == 2
        assert blocked.block_rows(49_152, torch.device("cpu"), 64) == 1
        assert blocked.block_rows(256_000, torch.device("cpu"), 64) == 1
        monkeypatch.setenv("SPECPROBE_L2_BYTES", str(8 * 1024 * 1024))
        blocked.l2_bytes.cache_clear()
        assert blocked.block_rows(49_152, torch.device("cpu"), 64) == 7
        assert blocked.block_rows(49_152, torch.device("meta"), 64) == 64  # not a CPU: the whole chunk
    finally:
        blocked.l2_bytes.cache_clear()
    assert blocked.segment(49_152) == 256 and blocked.segment(151_936) == 128 and blocked.segment(50_257) == 50_257


@pytest.mark.parametrize("ts,ds", [CASES[0], (TRUNCATING[0], TRUNCATING[1]), (Sampling(temperature=0.0), TRUNCATING[2])])
def test_blocks_spread_over_threads_give_the_same_metrics(ts: Sampling, ds: Sampling, monkeypatch: pytest.MonkeyPatch) -> None:
    """With more than one torch thread the blocks go to worker threads (each op on one
    core): the same numbers as one thread, −inf drafter rows handled wherever they fall,
    and torch's thread count is given back."""
    monkeypatch.setenv("SPECPROBE_SCORER", "torch")  # the torch-op blocks
    tl, dl = _logits(n=29, v=512)
    dl[13, 40:] = float("-inf")
    want = core.position_metrics_reference(tl, dl, ts, ds, top=5)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        monkeypatch.setattr(blocked, "block_rows", lambda *_a: 2)
        _assert_same(core.position_metrics(tl, dl, ts, ds, top=5), want)
        assert torch.get_num_threads() == 3 and blocked._POOL["n"] == 3
        with torch.inference_mode():  # as scoring calls it: the workers write inference tensors too
            _assert_same(core.position_metrics(tl, dl, ts, ds, top=5), want)
        with torch.no_grad():
            got = core.position_metrics(tl.requires_grad_(), dl, ts, ds)
        assert not got.accept_prob.requires_grad
    finally:
        torch.set_num_threads(before)



def test_a_pool_from_another_process_is_made_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked child's copy of the worker pool has no threads behind it: one made in
    another process (another pid) is replaced, not waited on."""
    monkeypatch.setenv("SPECPROBE_SCORER", "torch")  # the torch-op blocks
    tl, dl = _logits(n=9, v=512)
    s = Sampling(temperature=0.7)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(blocked, "block_rows", lambda *_a: 1)
        want = core.position_metrics(tl, dl, s, s).accept_prob
        old = blocked._POOL["pool"]
        monkeypatch.setitem(blocked._POOL, "pid", -1)  # as a forked child sees it
        torch.testing.assert_close(core.position_metrics(tl, dl, s, s).accept_prob, want)
        assert blocked._POOL["pool"] is not old and blocked._POOL["pid"] == os.getpid()
    finally:
        torch.set_num_threads(before)


def test_scoring_from_a_worker_thread_runs_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller already on one of the pool's threads (a head's blocks in scoring) scores
    its rows itself instead of waiting on the pool it occupies."""
    import threading

    tl, dl = _logits(n=9, v=512)
    s = Sampling(temperature=0.7)
    want = core.position_metrics_reference(tl, dl, s, s).accept_prob
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    release = threading.Event()
    try:
        monkeypatch.setitem(blocked._POOL, "pid", -1)  # fresh workers: they start at torch's 2 threads
        pool = blocked.worker_pool(2)
        busy = pool.submit(release.wait, 60)  # the other worker is taken
        job = pool.submit(lambda: blocked.blocked_metrics(tl, dl, s, s, rows=1)["alpha"])
        torch.testing.assert_close(job.result(timeout=60).clamp(0.0, 1.0), want)  # through the pool: no worker left
    finally:
        release.set()
        torch.set_num_threads(before)
    assert busy.result(timeout=60)
