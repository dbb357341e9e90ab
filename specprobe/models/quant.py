"""Weight and KV-cache quantization simulated on the fly: round-to-nearest (RTN) onto the served
format's grid, then dequantized back to the compute dtype so every matmul runs as before.

This is RTN simulation, not AWQ/GPTQ calibration: a calibrated checkpoint places its
rounding to minimise the layer's output error, so it is usually closer to the full
model than these weights are. Read the numbers as "at most this far", not as the served
checkpoint.

Schemes (`--target-quant` / `--draft-quant`):

  fp8              e4m3 weights (max 448), one scale per output channel, scale = amax / 448
                   (llm-compressor's FP8 / FP8_DYNAMIC schemes: channel-wise weights)
  fp8:per-tensor   e4m3 weights with one scale for the whole matrix (vLLM's online
                   `--quantization fp8`)
  int8             W8A16: symmetric int8 per output channel, scale = amax / 127.5, q in [-128, 127]
  int4             W4A16: symmetric int4 in groups of 128 input columns, scale = amax / 7.5,
                   q in [-8, 7] (compressed-tensors' and GPTQ's symmetric ranges; RTN)

Every `nn.Linear` inside the decoder layers is quantized; the embeddings and the LM head
stay in high precision, as llm-compressor's recipes leave them (`ignore: [lm_head]`) and
vLLM loads them. A layer-skip self-draft shares the target's modules, so quantizing the
target quantizes it too.

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

from specprobe.settings.model import QUANT_SCHEMES

SCHEMES = QUANT_SCHEMES  # the --target-quant / --draft-quant choices

E4M3_MAX = 448.0
INT4_GROUP = 128
NOTE = "RTN simulation (round-to-nearest onto the format's grid, dequantized to the compute dtype), not AWQ/GPTQ calibration"


# ----------------------------------------------------------------------------- the grids
def fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest e4m3 value (saturating at ±448), in x's dtype."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype)


def fp8_weight(w: torch.Tensor, per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(dequantized weight, scale): w [out, in] on the e4m3 grid times one scale per output
    row (or one for the tensor), scale = amax / 448 so the largest weight maps to 448."""
    wf = w.float()
    amax = wf.abs().amax() if per_tensor else wf.abs().amax(dim=1, keepdim=True)
    scale = (amax / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    q = (wf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(w.dtype), scale


def int_weight(w: torch.Tensor, bits: int, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dequantized weight, scale): symmetric round-to-nearest onto [-2^(b-1), 2^(b-1) - 1]
    with scale = amax / ((2^b - 1) / 2), per output row (group None) or per `group` input
    columns of each row. A row whose length is not a multiple of the group ends in a
    shorter group (engines require the multiple; the simulation need not)."""
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
    deq = (q * scale).reshape(out_f, -1)[:, :in_f]
    return deq.to(w.dtype), scale.squeeze(2)


def quantize_weight(w: torch.Tensor, scheme: str) -> torch.Tensor:
    """w [out, in] as `scheme` would serve it, dequantized to w's dtype."""
    if scheme == "fp8":
        return fp8_weight(w)[0]
    if scheme == "fp8:per-tensor":
        return fp8_weight(w, per_tensor=True)[0]
    if scheme == "int8":
        return int_weight(w, 8)[0]
    if scheme == "int4":
        return int_weight(w, 4, INT4_GROUP)[0]
    raise ValueError(f"unknown quantization scheme {scheme!r}")


# ----------------------------------------------------------------------------- a model
@dataclass
class Quantized:
    """What `quantize_model` did: the scheme, the layers, and (keep=True) the original
    weights, which `full_precision` swaps back in for a forward pass."""

    scheme: str
    layers: list[str] = field(default_factory=list)
    originals: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    modules: dict[str, Any] = field(default_factory=dict, repr=False)
    rel_error: float = 0.0  # ‖W_q − W‖ / ‖W‖ over every quantized weight

    def record(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "method": "rtn", "layers": len(self.layers), "weight_rel_error": round(self.rel_error, 6), "note": NOTE}


def decoder_linears(model: Any) -> Iterator[tuple[str, torch.nn.Linear]]:
    """Every nn.Linear inside the decoder layers (attention and MLP projections); the
    embeddings and the LM head are outside them."""
    from specprobe.models.anatomy import decoder_layers

    layers, _ = decoder_layers(model)
    for i, layer in enumerate(layers):
        for name, mod in layer.named_modules():
            if isinstance(mod, torch.nn.Linear):
                yield f"layers.{i}.{name}", mod


@torch.no_grad()
def quantize_model(model: Any, scheme: str, keep: bool = False) -> Quantized:
    """Replace the decoder layers' linear weights in place by their RTN-quantized copies."""
    done = Quantized(scheme)
    err2 = ref2 = 0.0
    for name, mod in decoder_linears(model):
        w = mod.weight.data
        q = quantize_weight(w, scheme)
        err2 += float((q.float() - w.float()).pow(2).sum())
        ref2 += float(w.float().pow(2).sum())
        if keep:
            done.originals[name] = w
            done.modules[name] = mod
        if keep:
            mod.weight.data = q  # the original tensor is kept aside, not overwritten
        else:
            mod.weight.data.copy_(q)
        done.layers.append(name)
    done.rel_error = (err2 / ref2) ** 0.5 if ref2 else 0.0
    return done


@contextmanager
def full_precision(quantized: Quantized) -> Iterator[None]:
    """The original weights in place for the duration (a what-if forward pass), then the
    quantized ones back; the tensors are swapped, nothing is copied."""
    if not quantized.originals:
        raise RuntimeError("quantize_model(keep=True) keeps the original weights; this model kept none")
    served = {n: m.weight.data for n, m in quantized.modules.items()}
    try:
        for n, m in quantized.modules.items():
            m.weight.data = quantized.originals[n]
        yield
    finally:
        for n, m in quantized.modules.items():
            m.weight.data = served[n]


def serve_quantized(loaded: Any, scheme: str, keep: bool = False, progress: Any = None) -> Quantized:
    """A loaded model (specprobe.models.loader.LoadedModel) quantized in place as `scheme`
    serves it; what was done is kept on `loaded.quant`. The proven LM head is re-proved
    against the quantized forward at its next use."""
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


def decoder_layers_of(model: Any) -> Any:
    from specprobe.models.anatomy import decoder_layers

    return decoder_layers(model)[0]


def fp8_kv_cache(model: Any, scale: float = 1.0) -> str:
    """Round K and V to e4m3 wherever `model`'s decoder attention reads them, by a
    registered attention implementation that wraps the model's own (sdpa, eager, flash…)
    and uses its mask. Only this model's config switches to it, so a drafter of the same
    architecture keeps its own. Returns the implementation's name."""
    import sys

    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from specprobe.core.errors import ModelLoadError

    attn = _attention_modules(model)
    if not attn:
        raise ModelLoadError(f"{type(model).__name__}: no decoder attention with k_proj/v_proj found", "--kv-cache-dtype fp8 supports transformers decoder models (Llama, Qwen, Mistral, SmolLM2, …)")
    base = model.config._attn_implementation or "eager"
    if base.startswith("specprobe_fp8kv"):
        return base
    module = type(attn[0]).__module__
    eager = getattr(sys.modules[module], "eager_attention_forward", None)
    inner = ALL_ATTENTION_FUNCTIONS.get(base, eager)
    if inner is None:
        raise ModelLoadError(f"{type(model).__name__}: no attention function for {base!r}", "load the model with attn_implementation sdpa or eager")
    name = f"specprobe_fp8kv_{base}_{module.rsplit('.', 1)[-1]}_{scale:g}".replace(".", "_")

    def fp8_cached(mod: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return inner(mod, query, fp8_kv(key, scale), fp8_kv(value, scale), *args, **kwargs)

    AttentionInterface.register(name, fp8_cached)
    mask_base = base if base in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping else "eager"
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[mask_base])
    model.config._attn_implementation = name
    return name


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


def load_quantized_checkpoint(folder: Any, config: Any, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    """A quantized checkpoint read without its engine (compressed-tensors fp8, int and
    packed int; GPTQ; AWQ GEMM: specprobe.models.quant_checkpoint), dequantized to
    `dtype`. -> (model, its record). Other formats are refused with what to do."""
    import copy
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from specprobe.core.errors import ModelLoadError
    from specprobe.models.quant_checkpoint import check_format, dequantize_checkpoint

    qc = checkpoint_quantization(config) or {}
    check_format(qc, folder)  # refused before the model is built
    plain = copy.deepcopy(config)
    if hasattr(plain, "quantization_config"):
        delattr(plain, "quantization_config")
    model = AutoModelForCausalLM.from_config(plain, dtype=dtype)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    state, record = dequantize_checkpoint(tensors, qc, folder, dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(plain, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ModelLoadError(f"{folder}: the quantized checkpoint's tensors do not match its config ({len(missing)} missing, {len(unexpected)} unexpected, e.g. {(list(missing) + list(unexpected))[0]})", "check that config.json belongs to these safetensors files")
    if tied:
        model.tie_weights()
    return model, record
