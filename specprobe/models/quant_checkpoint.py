"""Quantized checkpoints read without their engines: each format's stored tensors
dequantized to the compute dtype as the format's own reference dequantizer computes them
— the served weights, not a simulation. `quantization_config` in config.json says which
format a checkpoint is.

compressed-tensors (llm-compressor; quant_method "compressed-tensors"; the top-level
`format`, or a config group's own under "mixed-precision"):
  float-quantized, naive-quantized (fp8)  `weight` in float8_e4m3fn × `weight_scale`
      ([out, 1] per channel, one for the tensor, or [out/bh, in/bw] per block).
  int-quantized, naive-quantized (int)    `weight` in int8, `weight_scale`, and for an
      asymmetric scheme `weight_zero_point`: W = (q − z) · s.
  pack-quantized                          `weight_packed` int32 [out, ⌈in·b/32⌉]: word j
      of a row holds input columns j·32/b … in order, column j·32/b + k in bits [b·k,
      b·k + b), each stored unsigned as q + 2^(b−1); `weight_shape` [out, in] cuts the
      padding; `weight_scale` [out, groups] (group), [out, 1] (channel) or [1] (tensor);
      `weight_zero_point` (asymmetric group/channel) packed the same way down the output
      dimension; `weight_g_idx` [in] (activation ordering "group"): input column c uses
      group g_idx[c], else c // group_size. W[o, c] = (q − z[o, g(c)]) · s[o, g(c)].
GPTQ (AutoGPTQ / GPTQModel; quant_method "gptq"): `qweight` int32 [in·b/32, out] packed
  down the input dimension (32/b consecutive input rows a word, the first in the low bits;
  3-bit as one little-endian bit stream per 32 rows), `qzeros` int32 [groups, out·b/32]
  packed across the output dimension the same way, `scales` [groups, out], `g_idx` [in]
  (with desc_act the rows' groups in activation order; else row // group_size). The
  original format (checkpoint_format "gptq") stores each zero minus one, so the zero is the
  stored value + 1; "gptq_v2" stores it as it is. W[o, i] = s[g(i), o] · (q[i, o] − z[g(i), o]).
AWQ (AutoAWQ GEMM; quant_method "awq", version "gemm", 4-bit, zero_point true): `qweight`
  int32 [in, out/8] and `qzeros` int32 [groups, out/8], both packed across the output
  dimension in AWQ's interleaved order — bits [4k, 4k + 4) of word w hold output column
  8w + (0, 2, 4, 6, 1, 3, 5, 7)[k] — and `scales` [groups, out]:
  W[o, i] = (q[i, o] − z[i // group_size, o]) · s[i // group_size, o].

The product (q − z) · s is exact in fp32 and is rounded once to the scales' dtype, as the
engines' dequantizers compute it in that dtype, then cast to the compute dtype. Anything
else is refused in one line with what to do.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from specprobe.core.errors import ModelLoadError

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output column (within 8) held by word slot k
_SIMULATE = "pass the unquantized checkpoint with --target-quant/--draft-quant int4|int8|fp8 to simulate the served weights"


def _refuse(folder: Any, what: str) -> ModelLoadError:
    return ModelLoadError(f"{folder}: {what}, which specprobe does not read", _SIMULATE)


# ----------------------------------------------------------------------------- bits
def unpack_bits(words: torch.Tensor, bits: int, n: int, dim: int) -> torch.Tensor:
    """Unsigned b-bit values from int32 words along `dim`, as one little-endian bit stream
    (value e in bits [b·e, b·e + b) of the words read in order): for b dividing 32 each
    word holds 32/b values, the first in the low bits. -> int32 values, n along `dim`."""
    w = words.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF  # [..., W] as unsigned
    pos = torch.arange(n, dtype=torch.int64) * bits
    word, shift = pos // 32, pos % 32
    if int(word.max()) >= w.shape[-1]:
        raise ValueError(f"{w.shape[-1]} words hold fewer than {n} values of {bits} bits")
    lo = w[..., word] >> shift
    spill = shift + bits > 32  # a value straddling two words (3-bit streams)
    if bool(spill.any()):
        nxt = torch.where(spill, word + 1, word).clamp(max=w.shape[-1] - 1)
        lo = lo | torch.where(spill, w[..., nxt] << (32 - shift), torch.zeros_like(lo))
    return (lo & ((1 << bits) - 1)).to(torch.int32).movedim(-1, dim)


def _dequant(q: torch.Tensor, zero: torch.Tensor | None, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(q − z) · s, exact in fp32, rounded once to the scales' dtype, then to `dtype`."""
    x = q.to(torch.float32)
    if zero is not None:
        x = x - zero.to(torch.float32)
    return (x * scale.to(torch.float32)).to(scale.dtype if scale.is_floating_point() else torch.float32).to(dtype)


def _columns(groups: torch.Tensor, g_idx: torch.Tensor | None, n: int) -> torch.Tensor:
    """[rows, groups] per-group values spread to [rows, n] input columns: column c takes
    group g_idx[c], else c // (n / groups)."""
    if g_idx is not None:
        return groups[:, g_idx.long()]
    size = -(-n // groups.shape[1])
    return groups.repeat_interleave(size, dim=1)[:, :n]


# ----------------------------------------------------------------------------- compressed-tensors
def _ct_group(qc: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The config group whose targets name this layer (`re:` patterns, a module name, or
    the class Linear); a lone group applies to every quantized layer."""
    groups = list((qc.get("config_groups") or {}).values())
    for g in groups:
        for t in g.get("targets") or []:
            t = str(t)
            if t == "Linear" or (t.startswith("re:") and re.match(t[3:], prefix)) or prefix == t or prefix.endswith("." + t):
                return dict(g)
    if len(groups) == 1:
        return dict(groups[0])
    raise ModelLoadError(f"no config group of the compressed-tensors quantization_config names layer {prefix}", "check that config.json belongs to these safetensors files")


def _ct_zero(t: dict[str, torch.Tensor], prefix: str, rows: int, bits: int, packed: bool) -> torch.Tensor | None:
    z = t.get(prefix + ".weight_zero_point")
    if z is None:
        return None
    if packed and z.dtype == torch.int32:  # packed down the output dimension, unsigned with the offset
        return unpack_bits(z, bits, rows, dim=0) - (1 << (bits - 1))
    return z


def _ct_layer(t: dict[str, torch.Tensor], prefix: str, qc: dict[str, Any], folder: Any, dtype: torch.dtype) -> tuple[torch.Tensor, str]:
    """One compressed-tensors layer's weight [out, in] and what it was ('int4', 'fp8', …)."""
    group = _ct_group(qc, prefix)
    args = group.get("weights") or {}
    fmt = str(group.get("format") or qc.get("format") or "")
    bits = int(args.get("num_bits", 8))
    scale = t[prefix + ".weight_scale"]
    g_idx = t.get(prefix + ".weight_g_idx")
    if g_idx is not None and bool((g_idx < 0).all()):
        g_idx = None  # -1 everywhere: no activation ordering saved
    if prefix + ".weight_packed" in t:
        if fmt not in ("pack-quantized", "mixed-precision", ""):
            raise _refuse(folder, f"a compressed-tensors {fmt} checkpoint with packed weights")
        if bits not in (2, 4, 8):
            raise _refuse(folder, f"a compressed-tensors pack-quantized {bits}-bit checkpoint (packings differ between versions below 8 bits but for 2 and 4)")
        shape = [int(x) for x in t[prefix + ".weight_shape"].tolist()] if prefix + ".weight_shape" in t else None
        packed = t[prefix + ".weight_packed"]
        rows, cols = (shape[0], shape[1]) if shape else (packed.shape[0], packed.shape[1] * 32 // bits)
        q = unpack_bits(packed, bits, cols, dim=1) - (1 << (bits - 1))
        zero = _ct_zero(t, prefix, rows, bits, packed=True)
        if args.get("symmetric") is False and str(args.get("strategy")) in ("group", "channel") and zero is None:
            raise ModelLoadError(f"{folder}: layer {prefix} is asymmetric but its checkpoint has no weight_zero_point", "check that the safetensors files are complete")
        return _ct_apply(q, zero, scale, g_idx, dtype), f"int{bits}"
    w = t[prefix + ".weight"]
    if w.dtype == torch.float8_e4m3fn:
        return _ct_apply(w, None, scale, None, dtype), "fp8:per-tensor" if scale.numel() == 1 else "fp8"
    if w.dtype == torch.int8:
        return _ct_apply(w, _ct_zero(t, prefix, w.shape[0], bits, packed=False), scale, g_idx, dtype), f"int{bits}"
    raise _refuse(folder, f"a compressed-tensors layer {prefix} stored as {w.dtype}")


def _ct_apply(q: torch.Tensor, zero: torch.Tensor | None, scale: torch.Tensor, g_idx: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """compressed-tensors' dequantize: the scale's shape says the strategy (one value:
    tensor; [out, 1]: channel; [out, groups]: group; [out/bh, in/bw]: block)."""
    rows, cols = q.shape
    s = scale.reshape(1, 1) if scale.numel() == 1 else scale.reshape(rows, 1) if scale.dim() == 1 else scale
    z = None if zero is None else zero.reshape(1, 1) if zero.numel() == 1 else zero.reshape(rows, 1) if zero.dim() == 1 else zero
    if s.shape[0] == rows or s.shape[0] == 1:
        if s.shape[1] > 1:  # groups along the input columns
            s = _columns(s.expand(rows, -1), g_idx, cols)
            z = None if z is None else _columns(z.expand(rows, -1), g_idx, cols)
        return _dequant(q, z, s, dtype)
    bh, bw = -(-rows // s.shape[0]), -(-cols // s.shape[1])  # blocks
    s = s.repeat_interleave(bh, 0).repeat_interleave(bw, 1)[:rows, :cols]
    return _dequant(q, None, s, dtype)


def _compressed_tensors(tensors: dict[str, torch.Tensor], qc: dict[str, Any], folder: Any, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], list[str]]:
    prefixes = sorted({k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale")})
    out: dict[str, torch.Tensor] = {}
    kinds: list[str] = []
    for p in prefixes:
        out[p + ".weight"], kind = _ct_layer(tensors, p, qc, folder, dtype)
        kinds.append(kind)
    # activation and KV-cache scales (kv_cache_scheme's k_scale / v_scale) are dropped: the
    # activations stay in the compute dtype, and --kv-cache-dtype fp8 uses scales of 1.0
    skip = (".weight_scale", ".weight_zero_point", ".weight_g_idx", ".weight_shape", ".weight_packed", ".input_scale", ".input_zero_point", ".output_scale", ".k_scale", ".v_scale", ".q_scale")
    for name, v in tensors.items():
        if name in out or name.endswith(skip) or (name.endswith(".weight") and name[: -len(".weight")] in prefixes):
            continue
        out[name] = v.to(dtype) if v.is_floating_point() else v
    return out, kinds


# ----------------------------------------------------------------------------- GPTQ and AWQ
def _packed_layers(tensors: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k[: -len(".qweight")] for k in tensors if k.endswith(".qweight"))


def _gptq(tensors: dict[str, torch.Tensor], qc: dict[str, Any], folder: Any, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], list[str]]:
    bits = int(qc.get("bits", 4))
    fmt = str(qc.get("checkpoint_format") or "gptq")
    plus = 1 if fmt == "gptq" else 0  # v1 stores each zero minus one
    out: dict[str, torch.Tensor] = {}
    layers = _packed_layers(tensors)
    for p in layers:
        scales = tensors[p + ".scales"]  # [groups, out]
        n_out = scales.shape[1]
        n_in = tensors[p + ".qweight"].shape[0] * 32 // bits
        q = unpack_bits(tensors[p + ".qweight"], bits, n_in, dim=0)  # [in, out]
        zeros = unpack_bits(tensors[p + ".qzeros"], bits, n_out, dim=1) + plus  # [groups, out]
        g_idx = tensors.get(p + ".g_idx")
        groups = g_idx.long() if g_idx is not None else torch.arange(n_in) // -(-n_in // scales.shape[0])
        out[p + ".weight"] = _dequant(q, zeros[groups], scales[groups], dtype).t().contiguous()
    _rest(tensors, out, layers, (".qweight", ".qzeros", ".scales", ".g_idx"), dtype)
    return out, [f"int{bits}"] * len(layers)


def _awq(tensors: dict[str, torch.Tensor], qc: dict[str, Any], folder: Any, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], list[str]]:
    group = int(qc.get("group_size", qc.get("q_group_size", 128)))
    order = torch.tensor(AWQ_ORDER)
    out: dict[str, torch.Tensor] = {}
    layers = _packed_layers(tensors)

    def columns(words: torch.Tensor) -> torch.Tensor:
        slots = unpack_bits(words, 4, words.shape[1] * 8, dim=1)  # slot order within each word
        idx = (torch.arange(slots.shape[1]) // 8) * 8 + order.repeat(words.shape[1])  # the column each slot holds
        cols = torch.empty_like(slots)
        cols[:, idx] = slots
        return cols

    for p in layers:
        scales = tensors[p + ".scales"]  # [groups, out]
        q = columns(tensors[p + ".qweight"])  # [in, out]
        zeros = columns(tensors[p + ".qzeros"])  # [groups, out]
        size = group if group > 0 else q.shape[0]
        g = torch.arange(q.shape[0]) // size
        out[p + ".weight"] = _dequant(q, zeros[g], scales[g], dtype).t().contiguous()
    _rest(tensors, out, layers, (".qweight", ".qzeros", ".scales"), dtype)
    return out, ["int4"] * len(layers)


def _rest(tensors: dict[str, torch.Tensor], out: dict[str, torch.Tensor], layers: list[str], parts: tuple[str, ...], dtype: torch.dtype) -> None:
    """Every tensor that is no packed layer's part, as stored (floats in `dtype`)."""
    owned = {p + s for p in layers for s in parts}
    for name, v in tensors.items():
        if name not in owned:
            out[name] = v.to(dtype) if v.is_floating_point() else v


# ----------------------------------------------------------------------------- entry
CT_FORMATS = ("float-quantized", "naive-quantized", "int-quantized", "pack-quantized", "mixed-precision")


def check_format(qc: dict[str, Any], folder: Any) -> None:
    """Refuse, in one line and before anything loads, a quantization_config whose format
    this module does not read."""
    method = str(qc.get("quant_method") or "")
    if method == "compressed-tensors":
        fmt = str(qc.get("format") or "")
        if fmt not in CT_FORMATS:
            raise _refuse(folder, f"a compressed-tensors {fmt or 'unnamed-format'} checkpoint (specprobe reads {', '.join(CT_FORMATS)})")
    elif method == "gptq":
        bits, fmt = int(qc.get("bits", 4)), str(qc.get("checkpoint_format") or "gptq")
        if bits not in (2, 3, 4, 8):
            raise _refuse(folder, f"a {bits}-bit GPTQ checkpoint")
        if fmt not in ("gptq", "gptq_v2"):
            raise _refuse(folder, f"a GPTQ checkpoint in the {fmt} format (specprobe reads the gptq and gptq_v2 layouts)")
    elif method == "awq":
        bits, version = int(qc.get("bits", qc.get("w_bit", 4))), str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise _refuse(folder, f"an AWQ checkpoint in the {version} layout (specprobe reads GEMM)")
        if bits != 4 or qc.get("zero_point", True) is False:
            raise _refuse(folder, f"an AWQ {bits}-bit checkpoint{' without zero points' if qc.get('zero_point') is False else ''} (specprobe reads 4-bit with zero points)")
    else:
        raise _refuse(folder, " ".join(f"a {method or 'unnamed'} {qc.get('format') or qc.get('bits') or ''}".split()) + " quantized checkpoint (specprobe reads compressed-tensors, GPTQ and AWQ GEMM)")


def dequantize_checkpoint(tensors: dict[str, torch.Tensor], qc: dict[str, Any], folder: Any, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A quantized checkpoint's tensors as a plain state dict in `dtype`, and its record
    (weights: the bit width, method "checkpoint", layers dequantized, note: the format)."""
    check_format(qc, folder)
    method = str(qc.get("quant_method") or "")
    if method == "compressed-tensors":
        state, kinds = _compressed_tensors(tensors, qc, folder, dtype)
        what = f"compressed-tensors {qc.get('format')}"
    elif method == "gptq":
        state, kinds = _gptq(tensors, qc, folder, dtype)
        act = ", act-order (g_idx)" if qc.get("desc_act") else ""
        what = f"GPTQ ({qc.get('checkpoint_format') or 'gptq'}) {qc.get('bits', 4)}-bit, groups of {qc.get('group_size', 128)}{act}, {'symmetric' if qc.get('sym', True) else 'asymmetric'}"
    elif method == "awq":
        state, kinds = _awq(tensors, qc, folder, dtype)
        what = f"AWQ GEMM 4-bit, groups of {qc.get('group_size', qc.get('q_group_size', 128))}"
    else:  # check_format refused it
        raise AssertionError(method)
    if not kinds:
        raise ModelLoadError(f"{folder}: config.json says {what}, but no layer in its safetensors files is stored that way", "check that config.json belongs to these safetensors files")
    found = sorted(set(kinds))
    weights = found[0] if len(found) == 1 else "mixed"
    return state, {"weights": weights, "method": "checkpoint", "layers": len(kinds), "weight_rel_error": None,
                   "note": f"{what} checkpoint ({', '.join(found)}), dequantized to the compute dtype as the format's reference dequantizer does: the served weights, not a simulation"}
