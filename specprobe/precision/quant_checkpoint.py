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
import sys
from dataclasses import dataclass
from typing import Any

import torch

from specprobe.core.errors import ModelLoadError

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output column (within 8) held by word slot k
_SIMULATE = "pass the unquantized checkpoint with --target-quant/--draft-quant int4|int8|fp8 to simulate the served weights"


def _refuse(folder: Any, what: str) -> ModelLoadError:
    return ModelLoadError(f"{folder}: {what}, which specprobe does not read", _SIMULATE)


@dataclass
class Layer:
    """One quantized layer as its checkpoint stores it: `form` (ct, gptq, awq) says which
    dequantizer reads `parts` (the stored tensors by their names, without the layer's
    prefix); `meta` its shape and bit width; `kind` what it is ('int4', 'fp8', …); `act`
    its input activations' quantization (compressed-tensors W8A8), None for A16."""

    form: str
    parts: dict[str, torch.Tensor]
    meta: dict[str, Any]
    kind: str
    act: dict[str, Any] | None = None


def layer_weight(layer: Layer, dtype: torch.dtype) -> torch.Tensor:
    """The layer's weight [out, in] in `dtype`, dequantized as its format specifies."""
    return _WEIGHT[layer.form](layer.parts, layer.meta, dtype)


# ----------------------------------------------------------------------------- bits
def unpack_bits(words: torch.Tensor, bits: int, n: int, dim: int) -> torch.Tensor:
    """Unsigned b-bit values from int32 words along `dim`, as one little-endian bit stream
    (value e in bits [b·e, b·e + b) of the words read in order): for b dividing 32 each
    word holds 32/b values, the first in the low bits. -> int32 values, n along `dim`."""
    if 32 % bits == 0:  # whole values a word: shift each word by every slot at once
        per = 32 // bits
        w32 = words.movedim(dim, -1)
        if per * w32.shape[-1] < n:
            raise ValueError(f"{w32.shape[-1]} words hold fewer than {n} values of {bits} bits")
        if sys.byteorder == "little":  # the words' bytes in order, each holding 8/b values, the first in the low bits
            by = w32.contiguous().view(torch.uint8)
            shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=words.device)
            vals = ((by.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(*w32.shape[:-1], -1)
        else:
            shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
            vals = ((w32.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(*w32.shape[:-1], -1)  # arithmetic shift, then the low bits: as unsigned
        return vals[..., :n].to(torch.int32).movedim(-1, dim)
    w = words.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF  # [..., W] as unsigned
    pos = torch.arange(n, dtype=torch.int64, device=words.device) * bits
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


def _columns(groups: torch.Tensor, g_idx: torch.Tensor | None, n: int, size: int | None = None) -> torch.Tensor:
    """[rows, groups] per-group values spread to [rows, n] input columns: column c takes
    group g_idx[c], else c // size — the config's group_size (a row that is no whole
    number of groups ends in a shorter one), or ⌈n / groups⌉ where the config names none."""
    if g_idx is not None:
        return groups[:, g_idx.long()]
    size = size or -(-n // groups.shape[1])
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


def _ct_layer(t: dict[str, torch.Tensor], prefix: str, qc: dict[str, Any], folder: Any) -> Layer:
    """One compressed-tensors layer's stored tensors, checked, as a Layer (`layer_weight`
    dequantizes it)."""
    group = _ct_group(qc, prefix)
    args = group.get("weights") or {}
    fmt = str(group.get("format") or qc.get("format") or "")
    bits = int(args.get("num_bits", 8))
    group_size = int(args["group_size"]) if str(args.get("strategy")) == "group" and args.get("group_size") else None
    act = _ct_activations(t, prefix, group.get("input_activations"), folder)
    parts = {"weight_scale": t[prefix + ".weight_scale"]}
    g_idx = t.get(prefix + ".weight_g_idx")
    if g_idx is not None and not bool((g_idx < 0).all()):  # -1 everywhere: no activation ordering saved
        parts["weight_g_idx"] = g_idx
    if prefix + ".weight_packed" in t:
        if fmt not in ("pack-quantized", "mixed-precision", ""):
            raise _refuse(folder, f"a compressed-tensors {fmt} checkpoint with packed weights")
        if bits not in (2, 4, 8):
            raise _refuse(folder, f"a compressed-tensors pack-quantized {bits}-bit checkpoint (packings differ between versions below 8 bits but for 2 and 4)")
        shape = [int(x) for x in t[prefix + ".weight_shape"].tolist()] if prefix + ".weight_shape" in t else None
        packed = t[prefix + ".weight_packed"]
        rows, cols = (shape[0], shape[1]) if shape else (packed.shape[0], packed.shape[1] * 32 // bits)
        parts["weight_packed"] = packed
        if prefix + ".weight_zero_point" in t:
            parts["weight_zero_point"] = t[prefix + ".weight_zero_point"]
        if args.get("symmetric") is False and str(args.get("strategy")) in ("group", "channel") and "weight_zero_point" not in parts:
            raise ModelLoadError(f"{folder}: layer {prefix} is asymmetric but its checkpoint has no weight_zero_point", "check that the safetensors files are complete")
        return Layer("ct", parts, {"bits": bits, "rows": rows, "cols": cols, "group": group_size}, f"int{bits}", act)
    w = t[prefix + ".weight"]
    parts["weight"] = w
    rows, cols = w.shape
    if w.dtype == torch.float8_e4m3fn:
        parts.pop("weight_g_idx", None)
        return Layer("ct", parts, {"bits": 8, "rows": rows, "cols": cols}, "fp8:per-tensor" if parts["weight_scale"].numel() == 1 else "fp8", act)
    if w.dtype == torch.int8:
        if prefix + ".weight_zero_point" in t:
            parts["weight_zero_point"] = t[prefix + ".weight_zero_point"]
        return Layer("ct", parts, {"bits": bits, "rows": rows, "cols": cols, "group": group_size}, f"int{bits}", act)
    raise _refuse(folder, f"a compressed-tensors layer {prefix} stored as {w.dtype}")


def _ct_weight(parts: dict[str, torch.Tensor], meta: dict[str, Any], dtype: torch.dtype) -> torch.Tensor:
    bits, rows, cols = meta["bits"], meta["rows"], meta["cols"]
    if "weight_packed" in parts:
        q = unpack_bits(parts["weight_packed"], bits, cols, dim=1) - (1 << (bits - 1))
        z = parts.get("weight_zero_point")
        if z is not None and z.dtype == torch.int32:  # packed down the output dimension, unsigned with the offset
            z = unpack_bits(z, bits, rows, dim=0) - (1 << (bits - 1))
        return _ct_apply(q, z, parts["weight_scale"], parts.get("weight_g_idx"), dtype, meta.get("group"))
    return _ct_apply(parts["weight"], parts.get("weight_zero_point"), parts["weight_scale"], parts.get("weight_g_idx"), dtype, meta.get("group"))


def _ct_activations(t: dict[str, torch.Tensor], prefix: str, acts: Any, folder: Any) -> dict[str, Any] | None:
    """A config group's input_activations as the forward quantizes them (vLLM's W8A8
    schemes): None for 16-bit activations; else {type, strategy, dynamic, symmetric,
    group_size, input_scale, input_zero_point} — a static scheme's scale (and zero point)
    read from the layer's `input_scale` (`input_zero_point`)."""
    if not acts:
        return None
    a = dict(acts)
    kind, bits = str(a.get("type") or "int"), int(a.get("num_bits") or 8)
    if bits != 8 or kind not in ("float", "int"):
        raise _refuse(folder, f"a compressed-tensors checkpoint with {bits}-bit {kind} input activations (specprobe quantizes 8-bit float and int activations)")
    strategy = str(a.get("strategy") or "tensor")
    dynamic = a.get("dynamic") in (True, "true", "True")
    out: dict[str, Any] = {"type": kind, "strategy": strategy, "dynamic": dynamic, "symmetric": a.get("symmetric") is not False, "group_size": a.get("group_size")}
    if dynamic:
        if strategy not in ("token", "tensor", "group"):
            raise _refuse(folder, f"a compressed-tensors checkpoint with dynamic {strategy} input activations")
        if strategy == "group" and not a.get("group_size"):
            raise ModelLoadError(f"{folder}: layer {prefix}'s input activations are grouped but name no group_size", "check config.json's quantization_config")
        return out
    scale = t.get(prefix + ".input_scale")
    if scale is None:
        raise ModelLoadError(f"{folder}: layer {prefix}'s input activations are static but its checkpoint has no input_scale", "check that the safetensors files are complete")
    if scale.numel() != 1:
        raise _refuse(folder, f"a compressed-tensors checkpoint with static {strategy} input scales of {scale.numel()} values")
    out["input_scale"] = scale
    if prefix + ".input_zero_point" in t:
        out["input_zero_point"] = t[prefix + ".input_zero_point"]
    return out


def _ct_apply(q: torch.Tensor, zero: torch.Tensor | None, scale: torch.Tensor, g_idx: torch.Tensor | None, dtype: torch.dtype, group_size: int | None = None) -> torch.Tensor:
    """compressed-tensors' dequantize: the scale's shape says the strategy (one value:
    tensor; [out, 1]: channel; [out, groups]: group; [out/bh, in/bw]: block)."""
    rows, cols = q.shape
    s = scale.reshape(1, 1) if scale.numel() == 1 else scale.reshape(rows, 1) if scale.dim() == 1 else scale
    z = None if zero is None else zero.reshape(1, 1) if zero.numel() == 1 else zero.reshape(rows, 1) if zero.dim() == 1 else zero
    if s.shape[0] == rows or s.shape[0] == 1:
        if s.shape[1] > 1:  # groups along the input columns
            s = _columns(s.expand(rows, -1), g_idx, cols, group_size)
            z = None if z is None else _columns(z.expand(rows, -1), g_idx, cols, group_size)
        return _dequant(q, z, s, dtype)
    bh, bw = -(-rows // s.shape[0]), -(-cols // s.shape[1])  # blocks
    s = s.repeat_interleave(bh, 0).repeat_interleave(bw, 1)[:rows, :cols]
    return _dequant(q, None, s, dtype)


CT_PARTS = (".weight_scale", ".weight_zero_point", ".weight_g_idx", ".weight_shape", ".weight_packed", ".input_scale", ".input_zero_point", ".output_scale", ".k_scale", ".v_scale", ".q_scale")


def _compressed_tensors(tensors: dict[str, torch.Tensor], qc: dict[str, Any], folder: Any) -> tuple[dict[str, Layer], dict[str, torch.Tensor]]:
    prefixes = sorted({k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale")})
    layers = {p: _ct_layer(tensors, p, qc, folder) for p in prefixes}
    # KV-cache scales (kv_cache_scheme's k_scale / v_scale) are dropped: --kv-cache-dtype fp8
    # uses scales of 1.0; the input activations' are on their layers (Layer.act)
    rest = {name: v for name, v in tensors.items() if not (name.endswith(CT_PARTS) or (name.endswith(".weight") and name[: -len(".weight")] in layers))}
    return layers, rest


# ----------------------------------------------------------------------------- GPTQ and AWQ
def _packed_layers(tensors: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k[: -len(".qweight")] for k in tensors if k.endswith(".qweight"))


def _gptq(tensors: dict[str, torch.Tensor], qc: dict[str, Any], folder: Any) -> tuple[dict[str, Layer], dict[str, torch.Tensor]]:
    bits = int(qc.get("bits", 4))
    plus = 1 if str(qc.get("checkpoint_format") or "gptq") == "gptq" else 0  # v1 stores each zero minus one
    layers: dict[str, Layer] = {}
    for p in _packed_layers(tensors):
        parts = {k: tensors[p + "." + k] for k in ("qweight", "qzeros", "scales", "g_idx") if p + "." + k in tensors}
        layers[p] = Layer("gptq", parts, {"bits": bits, "plus": plus, "group": int(qc.get("group_size") or -1)}, f"int{bits}")
    return layers, _rest(tensors, layers, (".qweight", ".qzeros", ".scales", ".g_idx"))


def _gptq_weight(parts: dict[str, torch.Tensor], meta: dict[str, Any], dtype: torch.dtype) -> torch.Tensor:
    bits = meta["bits"]
    scales = parts["scales"]  # [groups, out]
    n_out = scales.shape[1]
    n_in = parts["qweight"].shape[0] * 32 // bits
    q = unpack_bits(parts["qweight"], bits, n_in, dim=0)  # [in, out]
    zeros = unpack_bits(parts["qzeros"], bits, n_out, dim=1) + meta["plus"]  # [groups, out]
    g_idx = parts.get("g_idx")
    size = meta.get("group", -1) if meta.get("group", -1) > 0 else -(-n_in // scales.shape[0])  # group_size -1: one group
    groups = g_idx.long() if g_idx is not None else torch.arange(n_in, device=q.device) // size
    return _dequant(q, zeros[groups], scales[groups], dtype).t().contiguous()


def _awq(tensors: dict[str, torch.Tensor], qc: dict[str, Any], folder: Any) -> tuple[dict[str, Layer], dict[str, torch.Tensor]]:
    group = int(qc.get("group_size", qc.get("q_group_size", 128)))
    layers = {p: Layer("awq", {k: tensors[p + "." + k] for k in ("qweight", "qzeros", "scales")}, {"group": group}, "int4") for p in _packed_layers(tensors)}
    return layers, _rest(tensors, layers, (".qweight", ".qzeros", ".scales"))


def _awq_columns(words: torch.Tensor) -> torch.Tensor:
    """AWQ's interleaved words [rows, out/8] as 4-bit values [rows, out] in column order."""
    slots = unpack_bits(words, 4, words.shape[1] * 8, dim=1)  # slot order within each word
    order = torch.tensor(AWQ_ORDER, device=words.device)
    idx = (torch.arange(slots.shape[1], device=words.device) // 8) * 8 + order.repeat(words.shape[1])  # the column each slot holds
    cols = torch.empty_like(slots)
    cols[:, idx] = slots
    return cols


def _awq_weight(parts: dict[str, torch.Tensor], meta: dict[str, Any], dtype: torch.dtype) -> torch.Tensor:
    q = _awq_columns(parts["qweight"])  # [in, out]
    zeros = _awq_columns(parts["qzeros"])  # [groups, out]
    size = meta["group"] if meta["group"] > 0 else q.shape[0]
    g = torch.arange(q.shape[0], device=q.device) // size
    return _dequant(q, zeros[g], parts["scales"][g], dtype).t().contiguous()


def _rest(tensors: dict[str, torch.Tensor], layers: dict[str, Layer], parts: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Every tensor that is no packed layer's part, as stored."""
    owned = {p + s for p in layers for s in parts}
    return {name: v for name, v in tensors.items() if name not in owned}


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


def checkpoint_layers(tensors: dict[str, torch.Tensor], qc: dict[str, Any], folder: Any) -> tuple[dict[str, Layer], dict[str, torch.Tensor], dict[str, Any]]:
    """A quantized checkpoint's tensors split into its quantized layers (prefix -> Layer,
    the stored tensors as they are), every other tensor as stored, and the checkpoint's
    record (weights: the bit width, method "checkpoint", layers, note: the format)."""
    check_format(qc, folder)
    method = str(qc.get("quant_method") or "")
    if method == "compressed-tensors":
        layers, rest = _compressed_tensors(tensors, qc, folder)
        what = f"compressed-tensors {qc.get('format')}"
    elif method == "gptq":
        layers, rest = _gptq(tensors, qc, folder)
        act = ", act-order (g_idx)" if qc.get("desc_act") else ""
        what = f"GPTQ ({qc.get('checkpoint_format') or 'gptq'}) {qc.get('bits', 4)}-bit, groups of {qc.get('group_size', 128)}{act}, {'symmetric' if qc.get('sym', True) else 'asymmetric'}"
    elif method == "awq":
        layers, rest = _awq(tensors, qc, folder)
        what = f"AWQ GEMM 4-bit, groups of {qc.get('group_size', qc.get('q_group_size', 128))}"
    else:  # check_format refused it
        raise AssertionError(method)
    if not layers:
        raise ModelLoadError(f"{folder}: config.json says {what}, but no layer in its safetensors files is stored that way", "check that config.json belongs to these safetensors files")
    found = sorted({x.kind for x in layers.values()})
    acts = sorted({activation_words(x.act) for x in layers.values() if x.act is not None})
    weights = found[0] if len(found) == 1 else "mixed"
    record: dict[str, Any] = {"weights": weights, "method": "checkpoint", "layers": len(layers), "weight_rel_error": None,
                              "note": f"{what} checkpoint ({', '.join(found)}), dequantized to the compute dtype as the format's reference dequantizer does: the served weights, not a simulation"}  # fmt: skip
    if acts:
        record["activations"] = "; ".join(acts)
        record["note"] += f"; input activations quantized as vLLM does ({record['activations']})"
    return layers, rest, record


def activation_words(act: dict[str, Any]) -> str:
    """An input-activation scheme in a few words: 'fp8 dynamic per token', 'int8 static per tensor'."""
    kind = "fp8" if act["type"] == "float" else "int8"
    where = {"token": "per token", "tensor": "per tensor", "group": f"per token in groups of {act.get('group_size')}"}.get(act["strategy"], act["strategy"])
    sym = "" if act.get("symmetric", True) or kind == "fp8" else " asymmetric"
    return f"{kind}{sym} {'dynamic' if act['dynamic'] else 'static'} {where}"


def dequantize_checkpoint(tensors: dict[str, torch.Tensor], qc: dict[str, Any], folder: Any, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A quantized checkpoint's tensors as a plain state dict in `dtype` (every layer
    dequantized at once: the reference the in-memory form, specprobe.precision.qlinear, is
    tested against), and its record."""
    layers, rest, record = checkpoint_layers(tensors, qc, folder)
    state = {name: v.to(dtype) if v.is_floating_point() else v for name, v in rest.items()}
    for p, layer in layers.items():
        state[p + ".weight"] = layer_weight(layer, dtype)
    return state, record


_WEIGHT = {"ct": _ct_weight, "gptq": _gptq_weight, "awq": _awq_weight}
