"""The CPU scorer's inner loop compiled per row (numba): `metrics.blocked` calls it for
logits on a CPU (float32; half precision copied to it) under untruncated sampling (any
temperature, either side greedy) and keeps its torch ops for everything else (the
dispatch table, `metrics.dispatch`, says which); the numbers are the same as those ops'
(tested to 1e-5). Importing this module imports numba; `metrics.dispatch` does so on
first use and goes on without it.

Per row, one read from memory, a 256-wide segment at a time (with the segments two ahead
prefetched): the segment's maxima for both sides, then — from L1 — e = eˣ of
x = l/T − max_s/T in the segment's own frame, Σ e per side, Σ e_p·x_p and Σ e_p·x_q; the
segments' sums are then put into the row's frame (x = l/T − max/T: a segment's sums
scale by e^(max_s − max)/T), and a last pass over the kept e (a per-thread [2, V] buffer,
in L2) gives α·z_p = Σ min(e_p, e_q·z_p/z_q) when both sides sample. Each side's top-k ids
(argmax first) are read from the k segments with the largest maxima while the row is in
cache, and the row's metrics and the top ids' probabilities are finished here too, so a
chunk needs no torch op after. Sums run in float32 within a segment and in float64 across
segments (more exact than the whole-row float32 reductions of the torch ops).

Why numba: each torch op is one more pass over the row and one more dispatch, and a row
of 49k logits is small, so the dozen ops per row cost several times one pass (measured in
benchmarks/bench_diagnose.py). torch.compile, the other way to fuse, needs a C++ compiler
and takes half a minute or more to compile on a CPU; numba compiles these functions in a
few seconds, caches them on disk, and ships as a wheel.

Why our own eˣ: numba's `math.exp` is a scalar libm call per element, which the compiler
cannot vectorise without Intel's SVML (absent from current llvmlite builds). Here
x = n·ln 2 + f with |f| ≤ ln 2 / 2, eᶠ by a degree-5 near-minimax polynomial and 2ⁿ
written into a float's exponent bits: relative error ≤ 2.5e-7 for x ≥ −87, and 0 below
(where float32's eˣ is a denormal or 0: under 1e-38 of the row's largest term).

On x86 the rows run with flush-to-zero and denormals-are-zero set (and the thread's
MXCSR put back after): products under 1e-38 — a tiny e times a small weight — are 0,
not denormals, each of which would cost a microcode assist.

Maxima are taken over integer keys (a float's bits, reordered so that integer order is
float order), because the compiler vectorises integer max/min reductions and not float
ones. The keys also reveal NaN (above +inf or below −inf): a row holding NaN or +inf, or
all −inf, is flagged for the torch ops, which give the reference's NaN."""

from __future__ import annotations

import os
import platform
import threading
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core import config as _numba_config
from numba.extending import intrinsic

from specprobe.metrics.sampling import LOGQ_FLOOR


def _prefer_512_bit_vectors() -> None:
    """Let numba's compiler use 512-bit vectors on a CPU with AVX-512. LLVM's tuning for
    recent Intel server CPUs prefers 256-bit ones (older chips slowed their clocks for
    wide vectors), and numba has no per-function switch, so this sets numba's feature
    string for the process: the host's own features with "-prefer-256-bit". Measured on
    this scorer's rows (Xeon with AVX-512, SmolLM2's 49k vocabulary): 30–37 % less time.
    Not done when NUMBA_CPU_FEATURES is set, or with SPECPROBE_KERNEL_512=0; it only
    takes effect if nothing in the process has compiled with numba yet."""
    if getattr(_numba_config, "CPU_FEATURES", None) is not None or os.environ.get("SPECPROBE_KERNEL_512", "1") == "0":
        return
    import llvmlite.binding as ll

    try:
        host = ll.get_host_cpu_features()
    except RuntimeError:  # LLVM cannot read this CPU's features: leave numba's default
        return
    if host.get("avx512f"):
        _numba_config.CPU_FEATURES = host.flatten() + ",-prefer-256-bit"  # type: ignore[attr-defined]


_prefer_512_bit_vectors()

_FLAGS = {"reassoc", "contract"}  # vectorised sums and fused multiply-add; NaN and ±inf keep their meaning
_F = np.float32
_LOG2E, _LN2_HI, _LN2_LO = _F(1.4426950408889634), _F(0.693145751953125), _F(1.428606765330187e-06)
_CUT = _F(-87.0)
# eᶠ on |f| ≤ ln 2 / 2: degree-5 near-minimax coefficients with p(0) = 1 exactly (relative
# error 9.1e-8 in exact arithmetic, 1.7e-7 evaluated in float32; Taylor's would need degree 7)
_P1, _P2, _P3, _P4, _P5 = (_F(0.9999997071868414), _F(0.4999914952509252), _F(0.16667636199525823), _F(0.04189793004555007), _F(0.008290314725593769))
_KEY_LOW = np.int32(-(2**31))
_KEY_HIGH = np.int32(2**31 - 1)
_KEY_POS_INF = np.int32(0x7F800000)  # key(+inf): a larger key is NaN
_KEY_NEG_INF = np.int32(-2139095041)  # key(−inf): a smaller key is NaN
_AHEAD = 2  # segments prefetched ahead (2, 4 and 8 measured within 4 % of each other; none 10 % slower)
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


@intrinsic  # type: ignore[misc]
def _prefetch(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """Ask the CPU to bring arr[idx]'s cache line into its caches (llvm.prefetch: a hint,
    no fault, no result), so that memory reads overlap the arithmetic on earlier data."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = builder.bitcast(cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]], wraparound=False), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        name = "llvm.prefetch.p0" if str(ptr.type) == "ptr" else "llvm.prefetch.p0i8"  # opaque or typed pointers
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]), name)
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_FTZ_DAZ = 0x8040  # MXCSR bits: flush denormal results to zero, read denormal inputs as zero


def _mxcsr_call(builder: Any, name: str, slot: Any) -> None:
    ptr = builder.bitcast(slot, ir.IntType(8).as_pointer())
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr.type]), name)
    builder.call(fn, [ptr])


@intrinsic  # type: ignore[misc]
def _flush_denormals(typingctx):  # type: ignore[no-untyped-def]
    """Set this thread's flush-to-zero and denormals-are-zero modes; return the previous
    MXCSR (for `_restore_mxcsr`). Terms under 1e-38 — a tiny e times a small weight — are
    then 0 instead of denormals, each of which costs the CPU a slow microcode assist
    (measured: 30 % of the rows' time on SmolLM2's logits). Off x86: nothing, returns 0."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        i32 = ir.IntType(32)
        if not _X86:
            return i32(0)
        slot = cgutils.alloca_once(builder, i32)
        _mxcsr_call(builder, "llvm.x86.sse.stmxcsr", slot)
        old = builder.load(slot)
        builder.store(builder.or_(old, i32(_FTZ_DAZ)), slot)
        _mxcsr_call(builder, "llvm.x86.sse.ldmxcsr", slot)
        return old

    return types.int32(), codegen


@intrinsic  # type: ignore[misc]
def _restore_mxcsr(typingctx, old):  # type: ignore[no-untyped-def]
    """Put back the MXCSR `_flush_denormals` returned (off x86: nothing)."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        if _X86:
            slot = cgutils.alloca_once(builder, ir.IntType(32))
            builder.store(args[0], slot)
            _mxcsr_call(builder, "llvm.x86.sse.ldmxcsr", slot)
        return context.get_dummy_value()

    return types.void(types.int32), codegen


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
    p = ((((_P5 * f + _P4) * f + _P3) * f + _P2) * f + _P1) * f + _F(1.0)
    r = p * _i2f((n + np.int32(127)) << np.int32(23))
    return r if x > _CUT else _F(0.0)


def _jit(fn: Any) -> Any:
    try:
        return numba.njit(nogil=True, fastmath=_FLAGS, cache=True)(fn)
    except Exception:  # no writable cache location: compiled per process instead
        return numba.njit(nogil=True, fastmath=_FLAGS)(fn)


@numba.njit(inline="always", nogil=True)  # type: ignore[misc]
def _insert(best, idx, x, i):  # type: ignore[no-untyped-def]
    """Keep best (descending, with their idx) the largest values seen: x (of index i)
    goes in after the equal ones already there, or not at all when it is not larger
    than the last."""
    k = best.shape[0]
    if x > best[k - 1]:
        p = k - 1
        while p > 0 and best[p - 1] < x:
            best[p] = best[p - 1]
            idx[p] = idx[p - 1]
            p -= 1
        best[p] = x
        idx[p] = i


@numba.njit(nogil=True)  # type: ignore[misc]
def _top_ids(row, segmax, c, ids):  # type: ignore[no-untyped-def]
    """ids[:k] = the row's k largest logits' ids, largest first, the first id among equal
    ones (as torch.argmax): they lie in the k segments with the largest maxima, so only
    those k·c logits are read. Unfilled places (fewer than k logits above −inf) stay −1."""
    k = ids.shape[0]
    ns = segmax.shape[0]
    best = np.full(k, -np.inf, dtype=np.float32)
    segs = np.full(k, ns, dtype=np.int64)
    for s in range(ns):  # the k segments with the largest maxima (the first on ties)
        _insert(best, segs, segmax[s], s)
    segs.sort()  # read in id order, so that a tie keeps the first id
    best[:] = -np.inf
    ids[:] = -1
    for q in range(k):
        s = segs[q]
        if s == ns:
            continue
        for j in range(s * c, s * c + c):
            _insert(best, ids, row[j], j)


@_jit
def _rows(tl, dl, rows, c, itp, itq, greedy_t, greedy_d, seg, shift, z, dots, alpha, bad, tops, res, probs, e, loc):  # type: ignore[no-untyped-def]
    v = tl.shape[1]
    ns = v // c
    e0 = e[0].reshape(ns, c)  # segment views: loops over range(c) on a 1-D view vectorise best
    e1 = e[1].reshape(ns, c)
    inf = np.inf
    mxcsr = _flush_denormals()
    for i in rows:
        t = tl[i].reshape(ns, c)
        d = dl[i].reshape(ns, c)
        # one pass over the row, a segment at a time: its maxima (the segment comes into
        # L1 from memory), then eˣ and the sums in the segment's own frame x − max_s
        # (read from L1), kept per segment in loc and put into the row's frame below
        lt = _KEY_HIGH
        ld = _KEY_HIGH
        ht = _KEY_LOW
        hd = _KEY_LOW
        tf = tl[i]
        df = dl[i]
        for s in range(ns):
            ts = t[s]
            ds = d[s]
            ahead = min(s + _AHEAD, ns - 1) * c  # a later segment's lines, one prefetch per 64 bytes
            for k in range(0, c, 16):
                _prefetch(tf, ahead + k)
                _prefetch(df, ahead + k)
            a = _KEY_LOW
            b = _KEY_LOW
            for j in range(c):
                ka = _key(ts[j])
                kb = _key(ds[j])
                a = max(a, ka)
                b = max(b, kb)
                lt = min(lt, ka)
                ld = min(ld, kb)
            ht = max(ht, a)
            hd = max(hd, b)
            mt = _unkey(a)
            md = _unkey(b)
            seg[i, 0, s] = mt
            seg[i, 1, s] = md
            # a segment all −inf (or not numbers: the row is flagged below) keeps frame 0
            sp = -mt * itp if -inf < mt < inf else _F(0.0)
            sq = -md * itq if -inf < md < inf else _F(0.0)
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
            loc[0, s] = -sp
            loc[1, s] = -sq
            loc[2, s] = zp_s
            loc[3, s] = zq_s
            loc[4, s] = dp_s
            loc[5, s] = dq_s
        if ht >= _KEY_POS_INF or hd >= _KEY_POS_INF or lt < _KEY_NEG_INF or ld < _KEY_NEG_INF or ht == _KEY_NEG_INF or hd == _KEY_NEG_INF:
            bad[i] = 1  # NaN or +inf somewhere, or a row of −inf: the torch ops give NaN
            continue
        _top_ids(tf, seg[i, 0], c, tops[0, i])  # while the row is in cache
        _top_ids(df, seg[i, 1], c, tops[1, i])
        # the row's frame: x = l/T − max/T. A segment with tempered max m_s contributes
        # w·Σ e_s, w·(Σ e_s·x_s + (m_s − M)·Σ e_s) with w = e^(m_s − M)
        mt = _unkey(ht)
        md = _unkey(hd)
        gp = mt * itp
        gq = md * itq
        shift[i, 0] = -gp
        shift[i, 1] = -gq
        zp = 0.0
        zq = 0.0
        dp = 0.0
        dq = 0.0
        for s in range(ns):
            if loc[2, s] > 0:
                up = loc[0, s] - gp
                wp = np.exp(up)
                zp += wp * loc[2, s]
                dp += wp * (loc[4, s] + up * loc[2, s])
                dq += wp * (loc[5, s] + (loc[1, s] - gq) * loc[2, s])
                loc[6, s] = wp
            else:
                loc[6, s] = 0.0
            if loc[3, s] > 0:
                wq = np.exp(loc[1, s] - gq)
                zq += wq * loc[3, s]
                loc[7, s] = wq
            else:
                loc[7, s] = 0.0
        # log q ≥ LOGQ_FLOOR ⇔ x_q ≥ log z_q + LOGQ_FLOOR: if the smallest x_q is below it
        # (−inf drafter logits, in practice), Σ e_p·x_q once more with the exact floor
        thr = np.log(zq) + LOGQ_FLOOR
        if (_unkey(ld) * itq - gq) < thr:
            dq = 0.0
            tq = _F(thr)
            sq = -gq
            for s in range(ns):
                ds = d[s]
                es0 = e0[s]
                dq_s = _F(0.0)
                for j in range(c):
                    dq_s += es0[j] * max(ds[j] * itq + sq, tq)
                dq += loc[6, s] * dq_s
        z[i, 0] = zp
        z[i, 1] = zq
        dots[i, 0] = dp
        dots[i, 1] = dq
        if not greedy_t and not greedy_d:  # over the e just written: α·z_p = Σ min(e_p, e_q·z_p/z_q), each in the row's frame
            r = zp / zq
            acc = 0.0
            for s in range(ns):
                fp = _F(loc[6, s])
                fq = _F(loc[7, s] * r)
                es0 = e0[s]
                es1 = e1[s]
                a_s = _F(0.0)
                for j in range(c):
                    a_s += min(es0[j] * fp, es1[j] * fq)
                acc += a_s
            alpha[i] = acc
        # the row's metrics, as `metrics.blocked._finish` makes them from the same numbers
        ti = tops[0, i]
        di = tops[1, i]
        if ti[ti.shape[0] - 1] < 0 or di[di.shape[0] - 1] < 0:
            continue  # ids left out: the torch ops finish this chunk
        plogp = dp / zp - np.log(zp)
        plogq = dq / zp - np.log(zq)  # weights e_p: divided by z_p
        agree = 1.0 if ti[0] == di[0] else 0.0
        if greedy_t and greedy_d:
            a = agree
        elif greedy_t:  # q of the target's token
            a = np.exp(dl[i, ti[0]] * itq - gq) / zq
        elif greedy_d:  # p of the drafter's token
            a = np.exp(tl[i, di[0]] * itp - gp) / zp
        else:
            a = alpha[i] / zp
        res[0, i] = a
        res[1, i] = agree
        res[2, i] = plogp - plogq
        res[3, i] = -plogp
        res[4, i] = 1.0 if greedy_d else 1.0 / zq  # max q = e⁰ / z_q
        # a greedy draft (the drafter's argmax) accepted with p of it; one-hot p when greedy
        res[5, i] = agree if greedy_t else np.exp(tl[i, di[0]] * itp - gp) / zp
        for j in range(probs.shape[2]):  # untruncated tempered probabilities of the top ids
            probs[0, i, j] = np.exp(tl[i, ti[j]] * itp - gp) / zp
            probs[1, i, j] = np.exp(dl[i, di[j]] * itq - gq) / zq
            probs[2, i, j] = np.exp(tl[i, di[j]] * itp - gp) / zp
            probs[3, i, j] = np.exp(dl[i, ti[j]] * itq - gq) / zq
    _restore_mxcsr(mxcsr)


def enabled() -> bool:
    """Whether the compiled rows still work: they did not fail to compile earlier in this
    process (`run_rows` switches them off then)."""
    return _STATE["error"] is None


def _scratch(v: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's buffers for one row (reused across calls): e [2, V] float32, and
    per segment its maxima, sums and weights [8, V/c] float64."""
    got = getattr(_TLS, "bufs", None)
    if got is None or got[0].shape[1] != v or got[1].shape[1] != v // c:
        got = _TLS.bufs = (np.empty((2, v), dtype=np.float32), np.empty((8, v // c), dtype=np.float64))
    return got  # type: ignore[no-any-return]


def run_rows(tl: np.ndarray, dl: np.ndarray, rows: np.ndarray, c: int, inv_t: tuple[float, float], greedy: tuple[bool, bool], out: dict[str, np.ndarray]) -> None:
    """Fill out's seg [N, 2, V/c], shift, z, dots [N, 2], alpha, bad [N], tops [2, N, k]
    (each side's k largest logits' ids, −1 where unfilled; not for bad rows), res [6, N]
    (α, agreement, KL, entropy, max q, p of the drafter's argmax) and probs [4, N, k] (p of the target's top ids, q of
    the drafter's, p of the drafter's, q of the target's; res and probs only for rows with
    every id filled) for `rows`
    (int64 row indices) of the C-contiguous float32 [N, V] logits (c divides V). Releases
    the GIL, so threads run rows side by side. A failure (a compile error) switches the
    compiled rows off for the process and is re-raised."""
    try:
        _rows(tl, dl, rows, c, _F(inv_t[0]), _F(inv_t[1]), greedy[0], greedy[1], out["seg"], out["shift"], out["z"], out["dots"], out["alpha"], out["bad"], out["tops"], out["res"], out["probs"], *_scratch(tl.shape[1], c))
    except Exception as err:
        _STATE["error"] = f"{type(err).__name__}: {err}"
        raise
