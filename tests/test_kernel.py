"""The compiled rows (`metrics.kernel`, numba) behind the default CPU scorer: equal to
the eager reference and to the torch-op blocks to 1e-5 in every untruncated sampling case,
vocabulary shape and thread count; its eˣ accurate to 2.5e-7 (relative); NaN/+inf rows handed to the
torch ops; a compile failure, SPECPROBE_SCORER=torch and a missing numba all fall back."""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest
import torch

import specprobe.metrics
from specprobe.metrics import blocked, core, dispatch
from specprobe.metrics.sampling import Sampling

kernel = pytest.importorskip("specprobe.metrics.kernel")

FIELDS = ("accept_prob", "accept_prob_greedy_draft", "greedy_agree", "kl_target_draft_nats", "target_entropy_nats", "draft_confidence")
UNTRUNCATED = [(Sampling(temperature=0.7), Sampling(temperature=0.7)), (Sampling(temperature=0.0), Sampling(temperature=1.0)), (Sampling(temperature=1.3), Sampling(temperature=0.0)), (Sampling(temperature=0.0), Sampling(temperature=0.0)), (Sampling(temperature=0.5), Sampling(temperature=1.2))]


def _logits(n: int, v: int, seed: int = 1, scale: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tl = torch.randn(n, v, generator=g) * scale
    return tl, tl + torch.randn(n, v, generator=g)


def _same(got: core.PositionMetrics, want: core.PositionMetrics, tops: bool = True) -> None:
    for f in FIELDS:
        torch.testing.assert_close(getattr(got, f), getattr(want, f), atol=1e-5, rtol=1e-5, msg=f, equal_nan=True)
    if tops:
        assert got.top is not None and want.top is not None and got.top.keys() == want.top.keys()
        for k, v in want.top.items():
            torch.testing.assert_close(got.top[k], v, atol=1e-6, rtol=1e-5, msg=k)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the rows the compiled function is handed."""
    seen: list[int] = []
    real = kernel.run_rows

    def spy(tl: np.ndarray, dl: np.ndarray, rows: np.ndarray, *a: object) -> None:
        seen.extend(rows.tolist())
        real(tl, dl, rows, *a)

    monkeypatch.setattr(kernel, "run_rows", spy)
    return seen


@pytest.mark.parametrize("ts,ds", UNTRUNCATED)
@pytest.mark.parametrize("v,draft_v", [(300, None), (512, None), (512, 490), (4096, None)])  # 300: one segment; 512/4096: 64-/256-wide segments; 490: padded
def test_compiled_rows_equal_the_reference(ts: Sampling, ds: Sampling, v: int, draft_v: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    tl, dl = _logits(23, v)
    dl = dl[:, : draft_v or v].contiguous()
    seen = _spy(monkeypatch)
    got = core.position_metrics(tl, dl, ts, ds, top=5)
    assert sorted(seen) == list(range(23))  # every row went through the compiled function
    monkeypatch.setenv("SPECPROBE_SCORER", "torch")
    torch_ops = core.position_metrics(tl, dl, ts, ds, top=5)
    assert len(seen) == 23  # switched off: not called again
    _same(got, torch_ops)
    if v <= 512:  # wider, the float32 whole-chunk reference drifts by ~2e-5 itself (float64 test below)
        _same(got, core.position_metrics_reference(tl, dl, ts, ds, top=5))


@pytest.mark.parametrize("v", [49_152, 50_257, 151_936])  # SmolLM2; GPT-2 (no 32–256 divisor: one segment); Qwen (128-wide)
def test_a_real_vocabulary_against_the_torch_blocks_and_float64(v: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real vocabulary widths: the compiled rows equal the torch blocks, and both are
    within 1e-5 of a float64 computation (the float32 whole-chunk reference itself drifts
    ~3e-4 in KL at 49,152), top-5 ids included."""
    tl, dl = _logits(4, v, scale=4.0)
    s = Sampling(temperature=0.7)
    got = core.position_metrics(tl, dl, s, s, top=5)
    monkeypatch.setenv("SPECPROBE_SCORER", "torch")
    _same(got, core.position_metrics(tl, dl, s, s, top=5))
    lp, lq = torch.log_softmax(tl.double() / 0.7, -1), torch.log_softmax(dl.double() / 0.7, -1)
    p = lp.exp()
    torch.testing.assert_close(got.kl_target_draft_nats.double(), (p * (lp - lq)).sum(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.target_entropy_nats.double(), -(p * lp).sum(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.accept_prob.double(), torch.minimum(p, lq.exp()).sum(-1), atol=1e-6, rtol=1e-5)
    assert got.top is not None and torch.equal(got.top["target_ids"], torch.topk(tl, 5).indices) and torch.equal(got.top["draft_ids"], torch.topk(dl, 5).indices)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_rows_dealt_to_threads_give_the_same_numbers(threads: int) -> None:
    tl, dl = _logits(29, 512)
    dl[13, 40:] = float("-inf")
    s = Sampling(temperature=0.8)
    want = core.position_metrics_reference(tl, dl, s, s, top=5)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():  # as scoring calls it
            _same(core.position_metrics(tl, dl, s, s, top=5), want)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_minus_inf_logits_get_finite_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head's vocabulary mapped into the target's: −inf drafter logits in some rows give
    the reference's finite, floored KL; a −inf target logit (a masked id) has p = 0 and
    adds nothing — finite entropy and KL on every path, not 0·−inf = NaN."""
    tl, dl = _logits(12, 512)
    dl[2, 5:60] = float("-inf")
    dl[7, 100:] = float("-inf")
    tl[4, :30] = float("-inf")
    s = Sampling(temperature=0.7)
    got, want = core.position_metrics(tl, dl, s, s), core.position_metrics_reference(tl, dl, s, s)
    assert torch.isfinite(got.kl_target_draft_nats).all() and torch.isfinite(got.target_entropy_nats).all() and got.kl_target_draft_nats[7] > 100
    _same(got, want, tops=False)
    monkeypatch.setenv("SPECPROBE_SCORER", "torch")
    _same(core.position_metrics(tl, dl, s, s), want, tops=False)


def test_nan_and_inf_rows_go_to_the_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows with NaN (either sign), +inf, or nothing but −inf are flagged by the compiled
    rows and scored by the torch ops: NaN metrics exactly where the torch path has them."""
    tl, dl = _logits(16, 512)
    neg_nan = struct.unpack("<f", struct.pack("<I", 0xFFC00000))[0]  # x86's default NaN: sign bit set
    tl[3, 7], dl[5, 9], dl[12, 0], tl[15] = float("nan"), neg_nan, float("inf"), float("-inf")
    assert np.signbit(dl[5, 9].numpy())
    s = Sampling(temperature=0.7)
    got = core.position_metrics(tl, dl, s, s, top=3)
    assert (~torch.isfinite(got.kl_target_draft_nats)).nonzero().flatten().tolist() == [3, 5, 12, 15]
    monkeypatch.setenv("SPECPROBE_SCORER", "torch")
    _same(got, core.position_metrics(tl, dl, s, s, top=3), tops=False)


def test_exp_is_accurate_to_2_5e_7() -> None:
    x = -np.concatenate([np.linspace(0, 87, 400_001), [0.0, 1e-30, 86.99, 87.0, 87.5, 100.0, 1e30, np.inf]]).astype(np.float32)
    got = np.array([kernel._exp(v) for v in x[::97]] + [kernel._exp(v) for v in x[-8:]], dtype=np.float64)
    xs = np.concatenate([x[::97], x[-8:]]).astype(np.float64)
    want = np.exp(xs)
    ok = xs > -87
    assert np.max(np.abs(got[ok] - want[ok]) / want[ok]) < 2.5e-7
    assert (got[~ok] == 0).all() and got[0] == 1.0


def test_a_compile_failure_falls_back_and_switches_the_rows_off(monkeypatch: pytest.MonkeyPatch) -> None:
    tl, dl = _logits(9, 512)
    s = Sampling(temperature=0.7)
    want = core.position_metrics_reference(tl, dl, s, s, top=2)

    def boom(*_a: object) -> None:
        raise RuntimeError("numba: LLVM failed")

    monkeypatch.setattr(kernel, "_rows", boom)
    monkeypatch.setitem(kernel._STATE, "error", None)
    _same(core.position_metrics(tl, dl, s, s, top=2), want)
    assert "LLVM failed" in kernel._STATE["error"] and not kernel.enabled()


def test_without_numba_the_torch_ops_score(monkeypatch: pytest.MonkeyPatch) -> None:
    tl, dl = _logits(9, 512)
    s = Sampling(temperature=0.7)
    monkeypatch.delitem(dispatch._NUMBA, "kernel", raising=False)
    monkeypatch.setitem(sys.modules, "specprobe.metrics.kernel", None)  # import fails
    monkeypatch.delattr(specprobe.metrics, "kernel")
    assert dispatch.compiled_rows() is None
    _same(core.position_metrics(tl, dl, s, s, top=2), core.position_metrics_reference(tl, dl, s, s, top=2))
    monkeypatch.delitem(dispatch._NUMBA, "kernel")


def test_truncating_sampling_and_explicit_blocks_keep_the_torch_ops_half_precision_is_upcast(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy(monkeypatch)
    tl, dl = _logits(8, 512)
    s = Sampling(temperature=0.8)
    core.position_metrics(tl, dl, Sampling(temperature=0.8, top_p=0.9), s)
    core.position_metrics(tl.bfloat16(), dl.bfloat16(), Sampling(temperature=0.8, top_k=5), s)
    blocked.blocked_metrics(tl, dl, s, s, rows=2)
    assert seen == []
    core.position_metrics(tl, dl, s, s)
    assert len(seen) == 8
    for dt in (torch.bfloat16, torch.float16):  # --dtype bfloat16 on a CPU: a float32 copy for the rows
        got = core.position_metrics(tl.to(dt), dl.to(dt), s, s, top=3)
        _same(got, core.position_metrics_reference(tl.to(dt), dl.to(dt), s, s, top=3), tops=False)
    assert len(seen) == 24


def test_the_command_shortens_openmp_spinning_before_torch_loads() -> None:
    """`specprobe` sets GOMP_SPINCOUNT before torch is imported (OpenMP reads it once),
    never over the user's own spin count or wait policy."""
    import os
    import subprocess

    from specprobe.core.openmp import SPIN_COUNT, shorten_spin

    env = {"PATH": "/usr/bin"}
    assert shorten_spin(env) and env["GOMP_SPINCOUNT"] == SPIN_COUNT
    for mine in ({"GOMP_SPINCOUNT": "5"}, {"OMP_WAIT_POLICY": "passive"}):
        assert not shorten_spin(dict(mine))
    probe = "import os, sys; import specprobe.cli.main; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", probe], env=base, capture_output=True, text=True, check=True).stdout.split()
    assert out == [SPIN_COUNT, "False"]
    out = subprocess.run([sys.executable, "-c", probe], env={**base, "GOMP_SPINCOUNT": "7"}, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["7", "False"]


def test_512_bit_vectors_only_on_avx512_hosts_and_never_over_the_users_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    import llvmlite.binding as ll
    from numba.core import config

    class Features(dict):  # llvmlite's FeatureMap: a dict with flatten()
        def flatten(self) -> str:
            return ",".join(("+" if v else "-") + k for k, v in self.items())

    for host, want in ((Features(avx2=True, avx512f=True), "+avx2,+avx512f,-prefer-256-bit"), (Features(avx2=True, avx512f=False), None)):
        monkeypatch.setattr(ll, "get_host_cpu_features", lambda host=host: host)
        monkeypatch.setattr(config, "CPU_FEATURES", None, raising=False)
        kernel._prefer_512_bit_vectors()
        assert want == config.CPU_FEATURES
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2", raising=False)  # NUMBA_CPU_FEATURES set
    kernel._prefer_512_bit_vectors()
    assert config.CPU_FEATURES == "+avx2"
    monkeypatch.setattr(config, "CPU_FEATURES", None, raising=False)
    monkeypatch.setenv("SPECPROBE_KERNEL_512", "0")
    kernel._prefer_512_bit_vectors()
    assert config.CPU_FEATURES is None


def test_denormals_are_flushed_inside_the_rows_only() -> None:
    """The rows run with flush-to-zero on (denormal terms cost microcode assists) and
    give the thread its floating-point modes back: a denormal product is still one after."""
    tiny = np.array([1e-38], dtype=np.float32)
    assert (tiny * np.float32(0.01))[0] != 0  # denormals on before
    tl, dl = _logits(3, 512, scale=30.0)  # wide logits: tiny e times small weights
    s = Sampling(temperature=0.5)
    _same(core.position_metrics(tl, dl, s, s, top=2), core.position_metrics_reference(tl, dl, s, s, top=2))
    assert (tiny * np.float32(0.01))[0] != 0
