"""Weight and KV-cache quantization simulated on the fly: round-to-nearest (RTN) onto the
served format's grid, the weights then held in that format (specprobe.precision.qlinear:
fp8 as torch.float8_e4m3fn, int8, int4 two to a byte, with their scales) and dequantized
per layer at each forward, so each matmul runs in the compute dtype on the served weights.

This is RTN simulation, not AWQ/GPTQ calibration: a calibrated checkpoint places its
rounding to minimise the layer's output error, so it is usually closer to the full
model than these weights are. Read the numbers as "at most this far", not as the served
checkpoint.

Schemes (`--target-quant` / `--draft-quant`):

  fp8              e4m3 weights (max 448), one scale per output channel, scale = amax / 448
                   (llm-compressor's FP8 / FP8_DYNAMIC schemes: channel-wise weights)
  fp8:per-tensor   e4m3 weights with one scale for the whole matrix (vLLM's online
                   `--quantization fp8`)
  fp8-dynamic      fp8's weights and each token's input activations on the e4m3 grid with
                   scale amax / 448 (llm-compressor's FP8_DYNAMIC as vLLM runs it: W8A8 fp8)
  int8             W8A16: symmetric int8 per output channel, scale = amax / 127.5, q in [-128, 127]
  w8a8-int8        int8's weights and each token's input activations symmetric int8 with
                   scale amax / 127 (llm-compressor's W8A8 as vLLM runs it)
  int4             W4A16: symmetric int4 in groups of 128 input columns, scale = amax / 7.5,
                   q in [-8, 7] (compressed-tensors' and GPTQ's symmetric ranges; RTN)

Every `nn.Linear` inside the decoder layers is quantized; the embeddings and the LM head
stay in high precision, as llm-compressor's recipes leave them (`ignore: [lm_head]`) and
vLLM loads them. A layer-skip self-draft shares the target's modules, so quantizing the
target quantizes it too. For the full-precision what-if (`serve_quantized(keep=True)`) the
original nn.Linear modules are kept aside and swapped back in for its forward pass: the
float weights as loaded plus the quantized ones, never a second float copy.

`--kv-cache-dtype fp8` (`fp8_kv_cache`): every key and value a decoder layer's attention
reads is rounded to e4m3 with vLLM's default scales (k_scale = v_scale = 1.0, used when the
checkpoint ships none): K after its rotary embedding, as the cache stores it; queries stay
in the compute dtype. vLLM's attention reads the current tokens from the cache too, so
the rounding applies to the prompt's own keys as well as the past ones. Rounding is
idempotent, so re-reading a cache of rounded values changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from specprobe.precision.qlinear import (
    QuantLinear,
    _decoder_linears,
    _load_state,
    float_layers,
    pack_int4,
    set_child,
)
from specprobe.settings.model import QUANT_SCHEMES

SCHEMES = QUANT_SCHEMES  # the --target-quant / --draft-quant choices

E4M3_MAX = 448.0
INT4_GROUP = 128
NOTE = "RTN simulation (round-to-nearest onto the format's grid, held quantized and dequantized per layer at each forward), not AWQ/GPTQ calibration"


# ----------------------------------------------------------------------------- the grids
def fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest e4m3 value (saturating at ±448), in x's dtype."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype)


def fp8_parts(w: torch.Tensor, per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): w [out, in] / scale on the e4m3 grid as torch.float8_e4m3fn, with one
    fp32 scale per output row (or one for the tensor), scale = amax / 448 so the largest
    weight maps to 448."""
    wf = w.float()
    amax = wf.abs().amax() if per_tensor else wf.abs().amax(dim=1, keepdim=True)
    scale = (amax / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    return (wf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def fp8_weight(w: torch.Tensor, per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(dequantized weight, scale): fp8_parts read back in w's dtype."""
    q, scale = fp8_parts(w, per_tensor)
    return (q.float() * scale).to(w.dtype), scale


def int_parts(w: torch.Tensor, bits: int, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(q, scale, g): symmetric round-to-nearest onto [-2^(b-1), 2^(b-1) - 1] with scale =
    amax / ((2^b - 1) / 2), per output row (group None) or per `group` input columns of
    each row; q int8 [out, in'] with each row padded with zeros to whole groups of g
    columns, scale fp32 [out, groups]. A row whose length is not a multiple of the group
    ends in a shorter group (engines require the multiple; the simulation need not)."""
    out_f, in_f = w.shape
    wf = w.float()
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    half_range = (qmax - qmin) / 2
    g = in_f if group is None else min(group, in_f)
    pad = (-in_f) % g
    if pad:
        wf = torch.nn.functional.pad(wf, (0, pad))
    grouped = wf.reshape(out_f, -1, g)  # [out, groups, g]
    amax = grouped.abs().amax(dim=2, keepdim=True)
    scale = (amax / half_range).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round(grouped / scale).clamp(qmin, qmax)
    return q.reshape(out_f, -1).to(torch.int8), scale.squeeze(2), g


def int_weight(w: torch.Tensor, bits: int, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dequantized weight, scale): int_parts read back in w's dtype, (q · s) per group."""
    q, scale, g = int_parts(w, bits, group)
    deq = (q.float().reshape(w.shape[0], -1, g) * scale.unsqueeze(2)).reshape(w.shape[0], -1)[:, : w.shape[1]]
    return deq.to(w.dtype), scale


# the weights of each scheme (format, per-tensor / bits, group) and its input activations
WEIGHTS: dict[str, tuple[str, Any, int | None]] = {
    "fp8": ("fp8", False, None), "fp8:per-tensor": ("fp8", True, None), "fp8-dynamic": ("fp8", False, None),
    "int8": ("int", 8, None), "w8a8-int8": ("int", 8, None), "int4": ("int", 4, INT4_GROUP),
}  # fmt: skip
ACTIVATIONS: dict[str, dict[str, Any]] = {
    "fp8-dynamic": {"type": "float", "strategy": "token", "dynamic": True, "symmetric": True},  # llm-compressor's FP8_DYNAMIC
    "w8a8-int8": {"type": "int", "strategy": "token", "dynamic": True, "symmetric": True},  # llm-compressor's W8A8 (int8)
}


def quantize_weight(w: torch.Tensor, scheme: str) -> torch.Tensor:
    """w [out, in] as `scheme` would serve it, dequantized to w's dtype."""
    if scheme not in WEIGHTS:
        raise ValueError(f"unknown quantization scheme {scheme!r}")
    form, arg, group = WEIGHTS[scheme]
    return fp8_weight(w, per_tensor=arg)[0] if form == "fp8" else int_weight(w, arg, group)[0]


def quantized_linear(mod: torch.nn.Linear, scheme: str) -> QuantLinear:
    """`mod` as a QuantLinear holding `scheme`'s quantized weight (and its activation
    quantization); its weight_float() equals quantize_weight(mod.weight, scheme)."""
    w = mod.weight.data
    form, arg, group = WEIGHTS[scheme]
    if form == "fp8":
        q, scale = fp8_parts(w, per_tensor=arg)
        parts, meta = {"q": q, "scale": scale}, {}
    else:
        q, scale, g = int_parts(w, arg, group)
        if arg == 4:
            q = pack_int4(torch.nn.functional.pad(q, (0, q.shape[1] % 2)))
        parts, meta = {"q": q, "scale": scale}, {"bits": arg, "group": g}
    bias = mod.bias.data if mod.bias is not None else None
    return QuantLinear(mod.in_features, mod.out_features, form, parts, meta, w.dtype, bias=bias, act=ACTIVATIONS.get(scheme), kind=scheme)


# ----------------------------------------------------------------------------- a model
@dataclass
class Quantized:
    """What `quantize_model` did: the scheme, the layers, and (keep=True) the original
    nn.Linear modules, which `full_precision` swaps back in for a forward pass."""

    scheme: str
    layers: list[str] = field(default_factory=list)
    originals: dict[str, torch.nn.Module] = field(default_factory=dict, repr=False)
    modules: dict[str, Any] = field(default_factory=dict, repr=False)  # name -> (decoder layer, its submodule's name, QuantLinear)
    rel_error: float = 0.0  # ‖W_q − W‖ / ‖W‖ over every quantized weight

    def record(self) -> dict[str, Any]:
        out = {"scheme": self.scheme, "method": "rtn", "layers": len(self.layers), "weight_rel_error": round(self.rel_error, 6), "note": NOTE}
        act = ACTIVATIONS.get(self.scheme)
        if act is not None:
            from specprobe.precision.quant_checkpoint import activation_words

            out["activations"] = activation_words(act)
            out["note"] = NOTE + f"; input activations {out['activations']} as vLLM quantizes them"
        return out


@torch.no_grad()
def quantize_model(model: Any, scheme: str, keep: bool = False) -> Quantized:
    """Replace the decoder layers' nn.Linear modules in place by QuantLinear modules that
    hold the RTN-quantized weights as served (fp8 as float8_e4m3fn, int8, int4 packed two
    to a byte) and dequantize them per forward. keep=True keeps the original modules aside
    (their float weights are the model as loaded) for `full_precision`; else they go."""
    if scheme not in WEIGHTS:
        raise ValueError(f"unknown quantization scheme {scheme!r}")
    done = Quantized(scheme)
    err2 = ref2 = 0.0
    for name, layer, sub, mod in list(_decoder_linears(model)):
        ql = quantized_linear(mod, scheme).to(mod.weight.device)
        w = mod.weight.data
        q = ql.weight_float()  # one layer's float weight at a time
        err2 += float((q.float() - w.float()).pow(2).sum())
        ref2 += float(w.float().pow(2).sum())
        del q
        set_child(layer, sub, ql)
        if keep:
            done.originals[name] = mod
            done.modules[name] = (layer, sub, ql)
        done.layers.append(name)
    done.rel_error = (err2 / ref2) ** 0.5 if ref2 else 0.0
    return done


@contextmanager
def full_precision(quantized: Quantized) -> Iterator[None]:
    """The original nn.Linear modules in place for the duration (a what-if forward pass),
    then the quantized ones back; modules are swapped, no weight is copied."""
    if not quantized.originals:
        raise RuntimeError("quantize_model(keep=True) keeps the original weights; this model kept none")
    try:
        for n, (layer, sub, _) in quantized.modules.items():
            set_child(layer, sub, quantized.originals[n])
        yield
    finally:
        for _n, (layer, sub, ql) in quantized.modules.items():
            set_child(layer, sub, ql)


def serve_quantized(loaded: Any, scheme: str, keep: bool = False, progress: Any = None) -> Quantized:
    """A loaded model (specprobe.models.loader.LoadedModel) quantized in place as `scheme`
    serves it; what was done is kept on `loaded.quant`. The proven LM head is re-proved
    against the quantized forward at its next use. A checkpoint already quantized on disk
    is refused: its layers are the served weights, with nothing to round."""
    on_disk = getattr(loaded, "checkpoint_quant", None)
    if on_disk is not None and getattr(getattr(loaded, "info", None), "extra", {}).get("gguf_held"):
        # a GGUF held as its blocks: the scheme is simulated on its dequantized weights, as
        # on any float model (each layer read back as the fp32 path reads it)
        if progress:
            progress(f"{loaded.name}: its GGUF layers dequantized to the compute dtype for the {scheme} simulation")
        float_layers(loaded.model)
        del loaded.checkpoint_quant
        on_disk = None
    if on_disk is not None:
        from specprobe.core.errors import ConfigError

        raise ConfigError(
            f"{loaded.name} is a quantized checkpoint ({on_disk.get('weights')}), which is already served as stored; --target-quant/--draft-quant {scheme} would quantize nothing",
            "leave --target-quant/--draft-quant out for a quantized checkpoint, or pass its unquantized checkpoint to simulate the scheme",
        )
    if progress:
        progress(f"quantizing {loaded.name} to {scheme} (round-to-nearest simulation)")
    done = quantize_model(loaded.model, scheme, keep=keep)
    loaded.quant = done
    loaded._head = None
    return done


# ----------------------------------------------------------------------------- the KV cache
def fp8_kv(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """K or V as an fp8 (e4m3) cache holds them: x / scale on the e4m3 grid, times scale."""
    return fp8_e4m3(x / scale) * scale if scale != 1.0 else fp8_e4m3(x)


def _attention_modules(model: Any) -> list[Any]:
    layers = decoder_layers_of(model)
    found = []
    for layer in layers:
        for mod in layer.modules():
            if hasattr(mod, "layer_idx") and hasattr(mod, "config") and hasattr(mod, "k_proj"):
                found.append(mod)
                break
    return found


def _inner_attention(model: Any, attn: list[Any], base: str) -> tuple[str, Any]:
    """The attention function a wrapper around `base` calls, and the short name of the
    attention modules' module (for the wrapper's name)."""
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from specprobe.core.errors import ModelLoadError

    module = type(attn[0]).__module__
    eager = getattr(sys.modules[module], "eager_attention_forward", None)
    inner = ALL_ATTENTION_FUNCTIONS.get(base, eager)
    if inner is None:
        raise ModelLoadError(f"{type(model).__name__}: no attention function for {base!r}", "load the model with attn_implementation sdpa or eager")
    return module.rsplit(".", 1)[-1], inner


def _use_attention(model: Any, name: str, base: str, fn: Any) -> str:
    """`fn` registered as attention implementation `name` (with `base`'s mask) and set on
    the model -> name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(name, fn)
    mask_base = base if base in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping else "eager"
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[mask_base])
    model.config._attn_implementation = name
    return name


def decoder_layers_of(model: Any) -> Any:
    from specprobe.models.anatomy import decoder_layers

    return decoder_layers(model)[0]


def fp8_kv_cache(model: Any, scale: float = 1.0) -> str:
    """Round K and V to e4m3 wherever `model`'s decoder attention reads them, by a
    registered attention implementation that wraps the model's own (sdpa, eager, flash…)
    and uses its mask. Only this model's config switches to it, so a drafter of the same
    architecture keeps its own. Returns the implementation's name."""
    from specprobe.core.errors import ModelLoadError

    attn = _attention_modules(model)
    if not attn:
        raise ModelLoadError(f"{type(model).__name__}: no decoder attention with k_proj/v_proj found", "--kv-cache-dtype fp8 supports transformers decoder models (Llama, Qwen, Mistral, SmolLM2, …)")
    base = model.config._attn_implementation or "eager"
    if base.startswith("specprobe_fp8kv"):
        return base
    module, inner = _inner_attention(model, attn, base)
    name = f"specprobe_fp8kv_{base}_{module}_{scale:g}".replace(".", "_")

    def fp8_cached(mod: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return inner(mod, query, fp8_kv(key, scale), fp8_kv(value, scale), *args, **kwargs)

    return _use_attention(model, name, base, fp8_cached)


def serve_fp8_kv(loaded: Any) -> None:
    """A loaded model's KV cache served as fp8 (`fp8_kv_cache`), noted on `loaded.kv_cache_dtype`."""
    loaded.attn_as_loaded = loaded.model.config._attn_implementation
    fp8_kv_cache(loaded.model)
    loaded.kv_cache_dtype = "fp8"
    loaded._head = None


@contextmanager
def as_loaded(loaded: Any) -> Iterator[None]:
    """The model as it was loaded for the duration: the original weights swapped back in
    (`serve_quantized(keep=True)`) and its own attention (no fp8 KV rounding)."""
    q = getattr(loaded, "quant", None)
    attn = getattr(loaded, "attn_as_loaded", None)
    served_attn = loaded.model.config._attn_implementation
    with full_precision(q) if q is not None else _nothing():
        if attn is not None:
            loaded.model.config._attn_implementation = attn
        try:
            yield
        finally:
            loaded.model.config._attn_implementation = served_attn


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# ----------------------------------------------------------------------------- quantized checkpoints on disk
def checkpoint_quantization(config: Any) -> dict[str, Any] | None:
    """config.json's quantization_config as a dict, or None for an unquantized checkpoint."""
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        return None
    return dict(qc) if isinstance(qc, dict) else qc.to_dict()


def load_quantized_checkpoint(folder: Any, config: Any, dtype: torch.dtype, in_memory: bool = True) -> tuple[Any, dict[str, Any]]:
    """A quantized checkpoint read without its engine (compressed-tensors fp8, int and
    packed int; GPTQ; AWQ GEMM: specprobe.precision.quant_checkpoint). Each decoder layer's
    linear weights stay as the safetensors files store them, in a QuantLinear that
    dequantizes them per forward (in_memory=False: every weight dequantized to `dtype` at
    load, the reference path); the model is built without weights first, so no float copy
    of the quantized layers is ever made. -> (model, its record). Other formats are
    refused with what to do."""
    import copy
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from specprobe.core.errors import ModelLoadError
    from specprobe.precision.quant_checkpoint import (
        check_format,
        checkpoint_layers,
        dequantize_checkpoint,
        layer_weight,
    )

    qc = checkpoint_quantization(config) or {}
    check_format(qc, folder)  # refused before the model is built
    plain = copy.deepcopy(config)
    if hasattr(plain, "quantization_config"):
        delattr(plain, "quantization_config")
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    if not in_memory:
        model = AutoModelForCausalLM.from_config(plain, dtype=dtype)
        state, record = dequantize_checkpoint(tensors, qc, folder, dtype)
        return _load_state(model, state, plain, folder, set()), record
    layers, rest, record = checkpoint_layers(tensors, qc, folder)
    del tensors
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):  # parameters on the meta device, buffers (rotary tables) real
        model = AutoModelForCausalLM.from_config(plain, dtype=dtype)
    inside = {id(m) for _, _, _, m in _decoder_linears(model)}
    state = {name: v.to(dtype) if v.is_floating_point() else v for name, v in rest.items()}
    held: set[str] = set()
    for prefix, layer in layers.items():
        try:
            mod = model.get_submodule(prefix)
        except AttributeError:
            raise ModelLoadError(f"{folder}: the quantized checkpoint's layer {prefix} is not in the model its config describes", "check that config.json belongs to these safetensors files") from None
        if id(mod) not in inside or not isinstance(mod, torch.nn.Linear):  # outside the decoder (a quantized LM head): dequantized once
            state[prefix + ".weight"] = layer_weight(layer, dtype)
            continue
        bias = state.pop(prefix + ".bias", None)
        set_child(model, prefix, QuantLinear(mod.in_features, mod.out_features, layer.form, layer.parts, layer.meta, dtype, bias=bias, act=layer.act, kind=layer.kind))
        held.add(prefix)
    record["note"] = record["note"].replace("dequantized to the compute dtype as the format's reference dequantizer does", "held as stored and dequantized per layer at each forward as the format's reference dequantizer does")
    return _load_state(model, state, plain, folder, held), record
