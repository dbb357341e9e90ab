"""A decoder linear layer held as it is served: the quantized weight stays quantized in
memory and is dequantized at each forward, one layer at a time, so a model takes its
quantized size plus one layer's float weight rather than its full-precision size.

`QuantLinear` replaces an `nn.Linear` inside a decoder layer and holds one of:

  fp8   (--target-quant fp8, fp8:per-tensor, fp8-dynamic)  the e4m3 weight as
        torch.float8_e4m3fn [out, in] and its fp32 scale ([out, 1] or one value)
  int   (--target-quant int8, int4, w8a8-int8)  symmetric integers and fp32 scales
        [out, groups]: int8 [out, in], or int4 two to a byte (uint8 [out, ⌈in'/2⌉], column
        2j in the low nibble, 2j + 1 in the high one, each stored as q + 8; in' is the row
        padded to whole groups)
  ct, gptq, awq  a quantized checkpoint's own tensors exactly as stored in its safetensors
        files (compressed-tensors int32 `weight_packed`, GPTQ/AWQ `qweight` and `qzeros`,
        scales, zero points, g_idx: specprobe.precision.quant_checkpoint.Layer)
  ggml  a GGUF's linear weight as the file stores it: `blocks`, uint8 [out, bytes per
        row], its ggml type in meta (Q8_0, Q4_K, …), read back as transformers' GGUF
        loader reads it (specprobe.precision.gguf_held, ggml_blocks.dequantize_ggml)

Its weight is the one the dequantize-at-load path computes, by the same arithmetic, and
its matmul is `nn.Linear`'s, so its output is bit-for-bit the same.

Input activations (`act`): W8A8 as vLLM runs it, quantized before the matmul and the
product taken in fp32 (the engines' fp8/int8 GEMMs accumulate in fp32 and scale the
result), then cast back to the compute dtype:

  fp8 dynamic per token   scale = max(amax(|x| over the row) / 448, 1 / (448 · 512)),
                          x_q = clamp(x · (1/scale), ±448) on the e4m3 grid
  int8 dynamic per token  symmetric: scale = amax / 127, x_q = round(x · 127 / amax) in
                          [−128, 127] (round half to even); asymmetric: scale = (max − min)
                          / 255, zero point azp = round(−128 − min / scale),
                          x_q = clamp(round(x / scale) + azp), read back as (x_q − azp) · scale
  per tensor              the amax over every row of the call (dynamic) or the
                          checkpoint's input_scale (static, with its input_zero_point)
  group                   per token in groups of `group_size` columns (fp8 block schemes)

A row of zeros stays zeros.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

E4M3_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (E4M3_MAX * 512.0)  # vLLM's floor on a dynamic fp8 scale


# ----------------------------------------------------------------------------- int4 packing
def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Signed int4 values [rows, n] (n even) two to a byte: column 2j in the low nibble,
    2j + 1 in the high one, each as q + 8. -> uint8 [rows, n/2]."""
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    return u[:, 0::2] | (u[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """pack_int4's inverse: uint8 [rows, m] -> int8 [rows, 2m] in [−8, 7]."""
    lo = (packed & 0x0F).to(torch.int8) - 8
    hi = (packed >> 4).to(torch.int8) - 8
    return torch.stack([lo, hi], dim=2).reshape(packed.shape[0], -1)


# ----------------------------------------------------------------------------- activations
def quantize_activations(x: torch.Tensor, act: dict[str, Any]) -> torch.Tensor:
    """x [..., in] quantized as `act` says and read back, in fp32 (the module docstring)."""
    xf = x.float()
    shape = xf.shape
    strategy = act.get("strategy", "token")
    if strategy == "group":
        g = int(act["group_size"])
        xf = xf.reshape(*shape[:-1], shape[-1] // g, g)
    fp8 = act["type"] == "float"
    if act.get("dynamic", True):
        dims = tuple(range(xf.dim())) if strategy == "tensor" else (-1,)
        if fp8 or act.get("symmetric", True):
            amax = xf.abs().amax(dim=dims, keepdim=True)
            if fp8:
                scale = (amax / E4M3_MAX).clamp(min=FP8_MIN_SCALE)
                out = _fp8(xf * scale.reciprocal()) * scale
            else:
                scale = amax / 127.0
                q = torch.round(xf * torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))).clamp(-128, 127)
                out = q * scale
        else:  # asymmetric int8 (vLLM's azp)
            lo, hi = xf.amin(dim=dims, keepdim=True), xf.amax(dim=dims, keepdim=True)
            scale = (hi - lo) / 255.0
            safe = torch.where(scale > 0, scale, torch.ones_like(scale))
            azp = torch.round(-128.0 - lo / safe)
            q = (torch.round(xf / safe) + azp).clamp(-128, 127)
            out = torch.where(scale > 0, (q - azp) * scale, xf)
    else:  # static: the checkpoint's per-tensor input_scale (and zero point)
        scale = act["input_scale"].float().reshape(())
        if fp8:
            out = _fp8(xf / scale) * scale
        else:
            zp = act.get("input_zero_point")
            z = zp.float().reshape(()) if zp is not None else torch.zeros((), device=xf.device)
            q = (torch.round(xf / scale) + z).clamp(-128, 127)
            out = (q - z) * scale
    return out.reshape(shape)


def _fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


# ----------------------------------------------------------------------------- the layer
class QuantLinear(torch.nn.Module):
    """An nn.Linear's replacement holding its weight quantized (the module docstring);
    `weight_float()` dequantizes it, `forward` does so for each call and lets it go."""

    def __init__(self, in_features: int, out_features: int, form: str, parts: dict[str, torch.Tensor], meta: dict[str, Any], dtype: torch.dtype,
                 bias: torch.Tensor | None = None, act: dict[str, Any] | None = None, kind: str = "") -> None:  # fmt: skip
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.form, self.meta, self.compute_dtype, self.kind = form, dict(meta), dtype, kind
        self._names = tuple(parts)
        for name, t in parts.items():
            self.register_buffer(name, t)
        self.bias = torch.nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.act = None
        if act is not None:
            self.act = {k: v for k, v in act.items() if not isinstance(v, torch.Tensor)}
            for k in ("input_scale", "input_zero_point"):
                if isinstance(act.get(k), torch.Tensor):
                    self.register_buffer(k, act[k])

    def parts(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n) for n in self._names}

    def weight_float(self) -> torch.Tensor:
        """The weight [out, in] in the compute dtype, dequantized as it is stored."""
        if self.form in ("fp8", "int"):
            stored, scale = self.parts()["q"], self.parts()["scale"]
            if self.form == "fp8":
                return (stored.float() * scale).to(self.compute_dtype)
            g, n = self.meta["group"], self.in_features
            q = unpack_int4(stored)[:, : scale.shape[1] * g] if self.meta["bits"] == 4 else stored
            grouped = q.float().reshape(self.out_features, -1, g)
            return (grouped * scale.unsqueeze(2)).reshape(self.out_features, -1)[:, :n].to(self.compute_dtype)
        if self.form == "ggml":  # a GGUF's rows of blocks (specprobe.precision.gguf_held)
            from specprobe.precision.ggml_blocks import dequantize_ggml

            return dequantize_ggml(self.parts()["blocks"], self.meta["type"], self.out_features, self.in_features).to(self.compute_dtype)
        from specprobe.precision.quant_checkpoint import Layer, layer_weight

        return layer_weight(Layer(self.form, self.parts(), self.meta, self.kind), self.compute_dtype)

    def stored_bytes(self) -> int:
        """What the quantized weight takes in memory (bias aside)."""
        return sum(int(b.numel()) * int(b.element_size()) for b in self.buffers())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight_float()
        if self.act is None:
            return torch.nn.functional.linear(x, w, self.bias)
        act = dict(self.act)
        for k in ("input_scale", "input_zero_point"):
            if hasattr(self, k):
                act[k] = getattr(self, k)
        xq = quantize_activations(x, act)
        y = torch.nn.functional.linear(xq, w.float(), None if self.bias is None else self.bias.float())
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        a = f", act={self.act['type']}:{self.act['strategy']}" if self.act else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, form={self.form}, kind={self.kind}{a}"


# ----------------------------------------------------------------------------- a model
def quant_linears(model: Any) -> Iterator[tuple[str, QuantLinear]]:
    for name, mod in model.named_modules():
        if isinstance(mod, QuantLinear):
            yield name, mod


def _decoder_linears(model: Any) -> Iterator[tuple[str, Any, str, torch.nn.Linear]]:
    """(name, decoder layer, its submodule's name, nn.Linear): the layers held quantized."""
    from specprobe.models.anatomy import decoder_layers

    layers, _ = decoder_layers(model)
    for i, layer in enumerate(layers):
        for name, mod in list(layer.named_modules()):
            if isinstance(mod, torch.nn.Linear):
                yield f"layers.{i}.{name}", layer, name, mod


def decoder_linears(model: Any) -> Iterator[tuple[str, torch.nn.Linear]]:
    """Every nn.Linear inside the decoder layers (attention and MLP projections); the
    embeddings and the LM head are outside them."""
    for full, _, _, mod in _decoder_linears(model):
        yield full, mod


def logical_params(model: Any) -> int:
    """The model's parameter count with each quantized layer's weight counted as the
    out × in values it stands for (its buffers are no parameters)."""
    n = sum(int(p.numel()) for p in model.parameters())
    return n + sum(m.in_features * m.out_features for _, m in quant_linears(model))


def weight_bytes(model: Any) -> int:
    """The bytes the model's weights take in memory: parameters, quantized layers'
    stored tensors and other buffers (each tensor counted once, tied ones too)."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen or t.device.type == "meta":
            continue
        seen.add(t.data_ptr())
        total += int(t.numel()) * int(t.element_size())
    return total


def float_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The model's state dict as a float checkpoint stores it: each QuantLinear's stored
    tensors replaced by its `weight` (dequantized, one layer at a time) and `bias`, for a
    consumer that writes or reads the weights themselves."""
    held = dict(quant_linears(model))
    state: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        prefix = name.rpartition(".")[0]
        if prefix not in held:
            state[name] = t
    for prefix, mod in held.items():
        state[prefix + ".weight"] = mod.weight_float()
        if mod.bias is not None:
            state[prefix + ".bias"] = mod.bias.data
    return state


def float_layers(model: Any, form: str = "ggml") -> int:
    """Every QuantLinear of `form` (a GGUF's held layers: "ggml") replaced in place by an
    nn.Linear holding its dequantized weight, one layer at a time (for a GGUF the fp32
    path's values, in the compute dtype): for --target-quant/--draft-quant, which simulate
    a scheme on the float weights. -> how many."""
    n = 0
    for name, mod in list(quant_linears(model)):
        if mod.form != form:
            continue
        w = mod.weight_float()
        lin = torch.nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, device="meta", dtype=w.dtype)
        lin.weight = torch.nn.Parameter(w, requires_grad=False)
        if mod.bias is not None:
            lin.bias = torch.nn.Parameter(mod.bias.data, requires_grad=False)
        set_child(model, name, lin)
        n += 1
    return n


def set_child(root: Any, dotted: str, module: Any) -> Any:
    """Replace the submodule at `dotted` (under root) by `module`; -> the one it replaced."""
    parent_name, _, leaf = dotted.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    old = getattr(parent, leaf)
    setattr(parent, leaf, module)
    return old


def _load_state(model: Any, state: dict[str, torch.Tensor], config: Any, folder: Any, held: set[str]) -> Any:
    """`state` into a model built without weights whose `held` layers are QuantLinear
    modules already (a quantized checkpoint, `quant.load_quantized_checkpoint`; a GGUF,
    `gguf_held`): every other parameter must come from it, tied ones aside."""
    from specprobe.core.errors import ModelLoadError

    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k.rpartition(".")[0] not in held]
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ModelLoadError(f"{folder}: the quantized checkpoint's tensors do not match its config ({len(missing)} missing, {len(unexpected)} unexpected, e.g. {(list(missing) + list(unexpected))[0]})", "check that config.json belongs to these safetensors files")
    if tied:
        model.tie_weights()
    left = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if left:
        raise ModelLoadError(f"{folder}: the quantized checkpoint has no tensor for {left[0]}", "check that the safetensors files are complete")
    return model
