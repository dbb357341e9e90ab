"""The CPU scorer's inner loop compiled per row (numba): `metrics.blocked` calls it for
float32 logits on a CPU under untruncated sampling (any temperature, either side greedy)
and keeps its torch ops for everything else; the numbers are the same as those ops'
(tested to 1e-5). Importing this module imports numba; `metrics.blocked` does so lazily
and goes on without it.

Per row, three passes, the first the only one that reads main memory:
1. both sides' per-segment maxima (argmax and top-k come from them later, as in the torch
   path) and each side's smallest logit;
2. x = l/T − max/T, e = eˣ (kept in a per-thread [2, V] buffer), Σ e per side, Σ e_p·x_p
   and Σ e_p·x_q — with the row in the core's cache;
3. α·z_p = Σ min(e_p, e_q·z_p/z_q) over the kept e (only when both sides sample).
Sums run in float32 within a segment and in float64 across segments.

Why numba: each torch op is one more pass over the row and one more dispatch, and a row
of 49k logits is small, so the dozen ops per row cost several times one pass (measured in
benchmarks/bench_diagnose.py). torch.compile, the other way to fuse, needs a C++ compiler
and takes half a minute or more to compile on a CPU; numba compiles these functions in a
few seconds, caches them on disk, and ships as a wheel.

Why our own eˣ: numba's `math.exp` is a scalar libm call per element, which the compiler
cannot vectorise without Intel's SVML (absent from current llvmlite builds). Here
x = n·ln 2 + f with |f| ≤ ln 2 / 2, eᶠ by a degree-7 polynomial and 2ⁿ written into a
float's exponent bits: relative error ≤ 1e-7 for x ≥ −87, and 0 below (where float32's eˣ
is a denormal or 0: under 1e-38 of the row's largest term).

Maxima are taken over integer keys (a float's bits, reordered so that integer order is
float order), because the compiler vectorises integer max/min reductions and not float
ones. The keys also reveal NaN (above +inf or below −inf): a row holding NaN or +inf, or
all −inf, is flagged for the torch ops, which give the reference's NaN."""

from __future__ import annotations

import os
import threading
from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

# log q floor, as `metrics.blocked.LOGQ_FLOOR`: a drafter's −inf logits cost a large,
# finite penalty, not an infinite KL
LOGQ_FLOOR = -1e4
_FLAGS = {"reassoc", "contract"}  # vectorised sums and fused multiply-add; NaN and ±inf keep their meaning
_F = np.float32
_LOG2E, _LN2_HI, _LN2_LO = _F(1.4426950408889634), _F(0.693145751953125), _F(1.428606765330187e-06)
_CUT = _F(-87.0)
_C2, _C3, _C4, _C5, _C6, _C7 = (_F(1 / 2), _F(1 / 6), _F(1 / 24), _F(1 / 120), _F(1 / 720), _F(1 / 5040))
_KEY_LOW = np.int32(-(2**31))
_KEY_HIGH = np.int32(2**31 - 1)
_KEY_POS_INF = np.int32(0x7F800000)  # key(+inf): a larger key is NaN
_KEY_NEG_INF = np.int32(-2139095041)  # key(−inf): a smaller key is NaN
_STATE: dict[str, Any] = {"error": None}
_TLS = threading.local()


@intrinsic  # type: ignore[misc]
def _i2f(typingctx, i):  # type: ignore[no-untyped-def]
    """The float32 whose bits are the int32 `i`."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return types.float32(types.int32), codegen


@intrinsic  # type: ignore[misc]
def _f2i(typingctx, x):  # type: ignore[no-untyped-def]
    """The int32 whose bits are the float32 `x`."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], context.get_value_type(types.int32))

    return types.int32(types.float32), codegen


@numba.njit(inline="always")  # type: ignore[misc]
def _key(x):  # type: ignore[no-untyped-def]
    """An int32 ordered as the float32 x is (sign-magnitude to two's complement)."""
    b = _f2i(x)
    return b ^ ((b >> np.int32(31)) & np.int32(0x7FFFFFFF))


@numba.njit(inline="always")  # type: ignore[misc]
def _unkey(k):  # type: ignore[no-untyped-def]
    return _i2f(k ^ ((k >> np.int32(31)) & np.int32(0x7FFFFFFF)))


@numba.njit(inline="always", fastmath=_FLAGS)  # type: ignore[misc]
def _exp(x):  # type: ignore[no-untyped-def]
    """eˣ for float32 x ≤ 0 (see the module docstring)."""
    v = max(x, _CUT)
    n = np.int32(v * _LOG2E - _F(0.5))  # nearest integer (v ≤ 0, and int() truncates toward 0)
    f = (v - _F(n) * _LN2_HI) - _F(n) * _LN2_LO
    p = ((((((_C7 * f + _C6) * f + _C5) * f + _C4) * f + _C3) * f + _C2) * f + _F(1.0)) * f + _F(1.0)
    r = p * _i2f((n + np.int32(127)) << np.int32(23))
    return r if x > _CUT else _F(0.0)


def _jit(fn: Any) -> Any:
    try:
        return numba.njit(nogil=True, fastmath=_FLAGS, cache=True)(fn)
    except Exception:  # no writable cache location: compiled per process instead
        return numba.njit(nogil=True, fastmath=_FLAGS)(fn)


@_jit
def _rows(tl, dl, rows, c, itp, itq, want_alpha, seg, shift, z, dots, alpha, bad, e):  # type: ignore[no-untyped-def]
    v = tl.shape[1]
    ns = v // c
    e0 = e[0].reshape(ns, c)  # segment views: loops over range(c) on a 1-D view vectorise best
    e1 = e[1].reshape(ns, c)
    for i in rows:
        t = tl[i].reshape(ns, c)
        d = dl[i].reshape(ns, c)
        # pass 1: per-segment maxima and the smallest logit of each side (integer keys)
        kt = _KEY_LOW
        kd = _KEY_LOW
        lt = _KEY_HIGH
        ld = lt
        for s in range(ns):
            ts = t[s]
            ds = d[s]
            a = _KEY_LOW
            b = _KEY_LOW
            for j in range(c):
                ka = _key(ts[j])
                kb = _key(ds[j])
                a = max(a, ka)
                b = max(b, kb)
                lt = min(lt, ka)
                ld = min(ld, kb)
            seg[i, 0, s] = _unkey(a)
            seg[i, 1, s] = _unkey(b)
            kt = max(kt, a)
            kd = max(kd, b)
        if kt >= _KEY_POS_INF or kd >= _KEY_POS_INF or lt < _KEY_NEG_INF or ld < _KEY_NEG_INF or kt == _KEY_NEG_INF or kd == _KEY_NEG_INF:
            bad[i] = 1  # NaN or +inf somewhere, or a row of −inf: the torch ops give NaN
            continue
        mt = _unkey(kt)
        md = _unkey(kd)
        sp = -mt * itp  # x = l/T − max/T
        sq = -md * itq
        shift[i, 0] = sp
        shift[i, 1] = sq
        # pass 2: e = eˣ of both sides into e; Σ e, Σ e_p·x_p, Σ e_p·x_q (x_q floored at LOGQ_FLOOR)
        zp = 0.0
        zq = 0.0
        dp = 0.0
        dq = 0.0
        for s in range(ns):
            ts = t[s]
            ds = d[s]
            es0 = e0[s]
            es1 = e1[s]
            zp_s = _F(0.0)
            zq_s = _F(0.0)
            dp_s = _F(0.0)
            dq_s = _F(0.0)
            for j in range(c):
                xp = ts[j] * itp + sp
                xq = ds[j] * itq + sq
                ep = _exp(xp)
                eq = _exp(xq)
                es0[j] = ep
                es1[j] = eq
                zp_s += ep
                zq_s += eq
                dp_s += ep * max(xp, _F(-1e30))  # e_p = 0 where x_p = −inf: the term is 0, not 0·−inf
                dq_s += ep * max(xq, _F(LOGQ_FLOOR))
            zp += zp_s
            zq += zq_s
            dp += dp_s
            dq += dq_s
        # log q ≥ LOGQ_FLOOR ⇔ x_q ≥ log z_q + LOGQ_FLOOR: if the smallest x_q is below it
        # (−inf drafter logits, in practice), Σ e_p·x_q once more with the exact floor
        thr = np.log(zq) + LOGQ_FLOOR
        if (_unkey(ld) * itq + sq) < thr:
            dq = 0.0
            tq = _F(thr)
            for s in range(ns):
                ds = d[s]
                es0 = e0[s]
                dq_s = _F(0.0)
                for j in range(c):
                    dq_s += es0[j] * max(ds[j] * itq + sq, tq)
                dq += dq_s
        z[i, 0] = zp
        z[i, 1] = zq
        dots[i, 0] = dp
        dots[i, 1] = dq
        if want_alpha:  # pass 3 over the e just written: α·z_p = Σ min(e_p, e_q·z_p/z_q)
            r = _F(zp / zq)
            acc = 0.0
            for s in range(ns):
                es0 = e0[s]
                es1 = e1[s]
                a_s = _F(0.0)
                for j in range(c):
                    a_s += min(es0[j], es1[j] * r)
                acc += a_s
            alpha[i] = acc


def enabled() -> bool:
    """Whether the compiled rows are used: not switched off (SPECPROBE_SCORER=torch keeps
    the torch ops) and not failed before in this process."""
    return os.environ.get("SPECPROBE_SCORER", "") != "torch" and _STATE["error"] is None


def _scratch(v: int) -> np.ndarray:
    """This thread's [2, V] float32 buffer for one row's e (reused across calls)."""
    e = getattr(_TLS, "e", None)
    if e is None or e.shape[1] != v:
        e = _TLS.e = np.empty((2, v), dtype=np.float32)
    return e


def run_rows(tl: np.ndarray, dl: np.ndarray, rows: np.ndarray, c: int, inv_t: tuple[float, float], want_alpha: bool, out: dict[str, np.ndarray]) -> None:
    """Fill out's seg [N, 2, V/c], shift, z, dots [N, 2], alpha and bad [N] for `rows`
    (int64 row indices) of the C-contiguous float32 [N, V] logits (c divides V). Releases
    the GIL, so threads run rows side by side. A failure (a compile error) switches the
    compiled rows off for the process and is re-raised."""
    try:
        _rows(tl, dl, rows, c, _F(inv_t[0]), _F(inv_t[1]), want_alpha, out["seg"], out["shift"], out["z"], out["dots"], out["alpha"], out["bad"], _scratch(tl.shape[1]))
    except Exception as err:
        _STATE["error"] = f"{type(err).__name__}: {err}"
        raise
