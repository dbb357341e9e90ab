"""ggml's KV-cache types as llama.cpp stores them: each value rounded as ggml's quantize
routines round a row when the cache is written, then read back as its dequantize routines
read it (ggml/src/ggml-quants.c, ggml-cpu/arch/x86/quants.c; llama.cpp as vendored by
llama-cpp-python 0.3.36). Pure tensor functions; `ggml_round(x, type)` works on the last
dimension, which must be a multiple of the type's block (32 for the block types).

  f16, bf16   the 16-bit float, round to nearest even (F16C / ggml's fp32 → bf16)
  q8_0        blocks of 32: d = amax / 127 stored as f16, q = round(x · 127 / amax) in
              [-127, 127] (half to even, the AVX2 routine the server runs), x̂ = q · d
  q4_0        blocks of 32: m = the value of largest magnitude (the first such), d = m / -8
              stored as f16, q = min(15, trunc(x / d + 8.5)), x̂ = (q − 8) · d
  q5_0        the same with d = m / -16, q = min(31, trunc(x / d + 16.5)), x̂ = (q − 16) · d
  q4_1        blocks of 32: d = (max − min) / 15 and min stored as f16,
              q = min(15, trunc((x − min) / d + 0.5)), x̂ = q · d + min
  q5_1        the same with 31 levels
  f32         the values as computed (the compute dtype)

The scale is computed in f32 and rounded to f16 only where it is stored, so quantization
divides by the f32 scale and dequantization multiplies by the f16 one, as ggml does.

Before a quantized cache stores them llama.cpp rotates K (with Q) and V by an orthonormal
Walsh–Hadamard matrix along each head (`rotation_orders`, `rotate`): Q·K is unchanged,
the error of the blocks is spread over the head, and the attention's output is rotated
back (H·H = I).

`query_type(k_type)`: the type the attention's K·Q dot product converts the query to
(the K type's `vec_dot_type` in ggml-cpu): f16 for an f16 K, bf16 for bf16, and 8-bit
blocks for the quantized K types (q8_0; q8_1 for q4_1/q5_1, whose values are the same —
its stored block sum, used for the min term, is not modelled).
"""

from __future__ import annotations

import torch

BLOCK = 32
FLOAT_TYPES = ("f32", "f16", "bf16")
BLOCK_TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
TYPES = FLOAT_TYPES + BLOCK_TYPES  # llama-server's --cache-type-k/-v values this simulates (not iq4_nl)


def _f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(torch.float32)


def _blocks(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % BLOCK:
        raise ValueError(f"ggml block types need the last dimension to be a multiple of {BLOCK}, got {x.shape[-1]}")
    return x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """1 / d, 0 where d is 0 (ggml's `id = d ? 1.0f/d : 0.0f`)."""
    return torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))


def q8_0(x: torch.Tensor) -> torch.Tensor:
    b = _blocks(x)
    amax = b.abs().amax(dim=-1, keepdim=True)
    d = amax / 127.0
    inv = torch.where(amax != 0, 127.0 / torch.where(amax != 0, amax, torch.ones_like(amax)), torch.zeros_like(amax))
    q = torch.round(b * inv)  # |q| ≤ 127 by construction
    return (q * _f16(d)).reshape(x.shape).to(x.dtype)


def _symmetric(x: torch.Tensor, levels: int) -> torch.Tensor:
    """q4_0 (levels 16) and q5_0 (32): the signed value of largest magnitude maps to -levels/2."""
    b = _blocks(x)
    idx = b.abs().argmax(dim=-1, keepdim=True)  # the first of equal magnitudes, as ggml's strict `<`
    m = b.gather(-1, idx)
    half = levels // 2
    d = m / -float(half)
    q = torch.clamp(torch.trunc(b * _inverse(d) + (half + 0.5)), max=levels - 1)
    return ((q - half) * _f16(d)).reshape(x.shape).to(x.dtype)


def _affine(x: torch.Tensor, levels: int) -> torch.Tensor:
    """q4_1 (levels 16) and q5_1 (32): min and step per block."""
    b = _blocks(x)
    lo = b.amin(dim=-1, keepdim=True)
    hi = b.amax(dim=-1, keepdim=True)
    d = (hi - lo) / float(levels - 1)
    q = torch.clamp(torch.trunc((b - lo) * _inverse(d) + 0.5), max=levels - 1)
    return (q * _f16(d) + _f16(lo)).reshape(x.shape).to(x.dtype)


def ggml_round(x: torch.Tensor, type_name: str) -> torch.Tensor:
    """x as a ggml `type_name` tensor holds it, read back in x's dtype."""
    if type_name == "f32":
        return x
    if type_name == "f16":
        return x.to(torch.float16).to(x.dtype)
    if type_name == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    if type_name == "q8_0":
        return q8_0(x)
    if type_name == "q4_0":
        return _symmetric(x, 16)
    if type_name == "q5_0":
        return _symmetric(x, 32)
    if type_name == "q4_1":
        return _affine(x, 16)
    if type_name == "q5_1":
        return _affine(x, 32)
    raise ValueError(f"unknown ggml type {type_name!r} (known: {', '.join(TYPES)})")


def query_type(k_type: str) -> str:
    """The type ggml's K·Q dot product converts the query to for a K cache of `k_type`."""
    if k_type in BLOCK_TYPES:
        return "q8_0"
    return k_type


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Walsh–Hadamard matrix of order n (a power of two), Sylvester's
    construction from 1/√n as llama.cpp builds it (src/llama-kv-cache.cpp); H = Hᵀ, H·H = I."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard matrix here has a power-of-two order, got {n}")
    h = torch.full((1, 1), 1.0 / float(torch.tensor(float(n)).sqrt()))
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rotate(x: torch.Tensor, n: int) -> torch.Tensor:
    """x with every run of n consecutive elements of its last dimension multiplied by the
    order-n Hadamard matrix (llama.cpp's llama_mul_mat_hadamard), in f32, back in x's dtype."""
    h = hadamard(n).to(x.device)
    xf = x.to(torch.float32)
    return (xf.reshape(*x.shape[:-1], x.shape[-1] // n, n) @ h).reshape(x.shape).to(x.dtype)


def rotation_orders(k_type: str, v_type: str, head_dim: int) -> tuple[int | None, int | None]:
    """The Hadamard orders llama.cpp rotates K (and Q) and V by before a quantized cache
    stores them (llama_kv_cache: attn_rot_k / attn_rot_v, on unless LLAMA_ATTN_ROT_DISABLE
    is set), None where it does not: only for a quantized type and a head size that is a
    multiple of 64; K by the largest power of two from 64 up that divides the head size, V
    by 64."""
    if head_dim % 64:
        return None, None
    nk = 64
    while head_dim % (nk * 2) == 0:
        nk *= 2
    return (nk if k_type in BLOCK_TYPES else None), (64 if v_type in BLOCK_TYPES else None)


def gguf_order(x: torch.Tensor) -> torch.Tensor:
    """Each head vector (last dimension) of a llama-family Q or K in the element order
    llama.cpp holds it: convert_hf_to_gguf permutes q_proj/k_proj rows so that its adjacent-
    pair RoPE equals transformers' rotate-half, so element 2i + h of llama.cpp's vector is
    transformers' h·(d/2) + i. Q·K is the same in either order; ggml's blocks and rotations
    are not."""
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], 2, d // 2).transpose(-1, -2).reshape(x.shape)


def block_of(type_name: str) -> int:
    """Elements per block: 32 for the block types, 1 for the floats."""
    return BLOCK if type_name in BLOCK_TYPES else 1


# ----------------------------------------------------------------------------- a GGUF's weight blocks
# A GGUF model's weights (specprobe.precision.gguf_held): rows of ggml blocks as the file
# stores them, uint8 [rows, bytes per row], read back as transformers' GGUF loader reads
# them — the `gguf` package's dequantizer (gguf.quants.dequantize, numpy), or for the types
# transformers' torch dequantizer covers (transformers.integrations.gguf.dequant: Q4_0,
# Q4_1, Q8_0, the K-quants, the IQ types) that one, on the tensor's own device; Q5_0 and
# Q5_1 (which that one lacks, and llama-quantize writes for rows that are not whole K-quant
# blocks) by `_q5`, gguf's arithmetic in torch. All
# compute each value by the same float32 products and sums (d · q, d · q + m,
# (d · sc) · q − dmin · m), so their values are the same bits (tests/test_gguf_held.py).
FLOAT_GGML = ("F32", "F16", "BF16")


def _torch_dequant_ids() -> dict[str, int]:
    try:
        from transformers.integrations.gguf.dequant import GGML_BLOCK, GGML_NAME
    except ImportError:  # a transformers without its torch dequantizer: numpy for all
        return {}
    return {GGML_NAME[i]: i for i in GGML_BLOCK if i in GGML_NAME}


def ggml_readable(type_name: str) -> bool:
    """Can a row of `type_name` blocks be dequantized here (by either dequantizer)?"""
    if type_name in FLOAT_GGML or type_name in ("Q5_0", "Q5_1") or type_name in _torch_dequant_ids():
        return True
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits

    try:
        return GGMLQuantizationType[type_name] in _type_traits
    except KeyError:
        return False


def dequantize_ggml(blocks: torch.Tensor, type_name: str, rows: int, cols: int) -> torch.Tensor:
    """uint8 blocks [rows, bytes per row] of ggml `type_name` -> float32 [rows, cols], on
    the blocks' device."""
    if type_name == "F32":
        return blocks.contiguous().view(torch.float32).reshape(rows, cols)
    if type_name in ("F16", "BF16"):
        return blocks.contiguous().view(torch.float16 if type_name == "F16" else torch.bfloat16).to(torch.float32).reshape(rows, cols)
    if type_name in ("Q5_0", "Q5_1"):  # which transformers' torch dequantizer leaves out
        return _q5(blocks, type_name == "Q5_1").reshape(rows, cols)
    ids = _torch_dequant_ids()
    if type_name in ids:
        from transformers.integrations.gguf.dequant import dequantize

        return dequantize(blocks.reshape(-1), ids[type_name], torch.float32).reshape(rows, cols)
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as np_dequantize

    values = np_dequantize(blocks.cpu().numpy(), GGMLQuantizationType[type_name])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(rows, cols).to(blocks.device)


def _q5(blocks: torch.Tensor, affine: bool) -> torch.Tensor:
    """Q5_0 / Q5_1 rows of blocks of 32 (ggml's dequantize_row_q5_0/_1, as the gguf
    package computes them): d (f16), for Q5_1 the minimum m (f16), the 32 fifth bits as one
    little-endian uint32, then 16 bytes of low nibbles — values 0–15 in the low halves,
    16–31 in the high ones. x = d · (q − 16), or d · q + m. -> float32, one row per block."""
    head = 4 if affine else 2
    b = blocks.contiguous().reshape(-1, head + 20)
    d = b[:, 0:2].view(torch.float16).to(torch.float32)
    qh = b[:, head : head + 4].to(torch.int64)
    high = (qh[:, 0:1] | (qh[:, 1:2] << 8) | (qh[:, 2:3] << 16) | (qh[:, 3:4] << 24)) >> torch.arange(32, device=b.device)
    qs = b[:, head + 4 :]
    low = torch.cat([qs & 0x0F, qs >> 4], dim=1)
    q = low.to(torch.int64) | ((high & 1) << 4)
    if not affine:
        return d * (q - 16).to(torch.float32)
    m = b[:, 2:4].view(torch.float16).to(torch.float32)
    return d * q.to(torch.float32) + m
