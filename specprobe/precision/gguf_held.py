"""A GGUF model held as llama.cpp serves it: each decoder layer's quantized linear weights
(attention q/k/v/o, MLP gate/up/down) stay as the file's ggml blocks in a QuantLinear
(form "ggml": uint8 [rows, bytes per row], specprobe.precision.qlinear) and are dequantized
per layer at each forward; the model is built from its config with empty weights and
filled from the file's tensors, so the fp32 model is never made.

The values are transformers' own (its GGUF loader, `load_gguf_checkpoint`, which the
fp32 path runs): the same tensor-name map (`get_gguf_hf_weights_map`), the same
per-architecture tensor processor — for llama the reversal of llama.cpp's Q/K row
permutation, a reordering of whole rows, which this module applies to the rows of
blocks by calling the processor on them — and the same dequantization of a block row
(`dequantize_ggml`: transformers' torch dequantizer, or the `gguf` package's, which the
loader calls; bit for bit the same). Embeddings, norms, the LM head (whose `weight` the
scorers and cost estimates read) and the tensors a file stores as F32/F16/BF16 are
dequantized at load, as the fp32 path computes them, and cast to the compute dtype; a file
of floats only is read the same way, with no layer held. `qlinear.float_layers` turns the held
layers back into nn.Linear modules in place, for --target-quant/--draft-quant, which
simulate a scheme on float weights.

Architectures whose tensor processor does more than reorder rows (MoE expert splits,
bloom's fused QKV reshape, gemma's norm offsets, …), or that transformers loads by its
newer path, and files with a ggml type neither dequantizer reads, take the fp32 path
(`held_plan` says why, in one line).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specprobe.core.errors import ModelLoadError
from specprobe.precision.ggml_blocks import FLOAT_GGML, ggml_readable
from specprobe.precision.qlinear import QuantLinear, _decoder_linears, _load_state, set_child

# transformers' tensor processors that only reorder rows of a linear weight (or nothing)
ROW_PROCESSORS = ("TensorProcessor", "LlamaTensorProcessor")


@dataclass(frozen=True)
class HeldPlan:
    """Whether a GGUF is held quantized (`held`), or why not (`why`, one line); the ggml
    types of its linear weights."""

    held: bool
    why: str
    types: tuple[str, ...] = ()
    float_bytes: int = 0  # every tensor dequantized to fp32, as the fp32 path holds it


@dataclass(frozen=True)
class Tensor:
    """One tensor of the file: its GGUF name, ggml type name, shape (torch order: rows
    first) and its bytes as stored, a read-only uint8 view of the mapped file [..., bytes
    per row]."""

    name: str
    type: str
    shape: tuple[int, ...]
    raw: np.ndarray


def read_tensors(path: Path) -> tuple[str, list[Tensor]]:
    """(architecture, tensors) of a GGUF, its data mapped, not read. The header is parsed
    by transformers' GGUF reader, which skips the tokenizer's string arrays (the `gguf`
    package's GGUFReader, which builds every one, reads a file with a type that one does
    not know)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import GGML_QUANT_SIZES

    def sized(name: str, ggml_type: int, shape: tuple[int, ...], view: np.ndarray) -> Tensor:
        qtype = GGMLQuantizationType(ggml_type)
        elems, size = GGML_QUANT_SIZES[qtype]
        row = shape[-1] // elems * size
        n = int(np.prod(shape[:-1], dtype=np.int64)) * row
        return Tensor(name, qtype.name, shape, view[:n].reshape(*shape[:-1], row))

    try:
        from transformers.integrations.gguf.reader import GgufHeader

        header = GgufHeader.from_file(str(path))
    except (ImportError, ValueError):  # no such reader, or a type it does not size
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        arch = str(reader.fields["general.architecture"].contents())
        return arch, [sized(t.name, int(t.tensor_type), tuple(int(x) for x in reversed(t.shape.tolist())), t.data.reshape(-1).view(np.uint8)) for t in reader.tensors]
    blob = np.memmap(str(path), mode="r", dtype=np.uint8)
    return header.architecture, [sized(t.name, t.ggml_type, tuple(t.shape), blob[header.data_start + t.offset :]) for t in header.tensors]


def held_plan(path: Path) -> HeldPlan:
    """Read the GGUF's header (no tensor data): can it be held as its blocks?"""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    arch, tensors = read_tensors(path)
    fp32 = 4 * sum(int(np.prod(t.shape, dtype=np.int64)) for t in tensors)
    try:
        from transformers.integrations.gguf.utils import is_gguf_arch_supported

        newer = bool(is_gguf_arch_supported(arch))
    except ImportError:  # a transformers without the newer GGUF path
        newer = False
    weights = [t for t in tensors if len(t.shape) == 2 and t.name.startswith("blk.") and t.name.endswith(".weight")]
    block = sorted({t.type for t in weights if t.type not in FLOAT_GGML})
    if newer:
        return HeldPlan(False, f"transformers loads the {arch} architecture by its newer GGUF path; dequantized to fp32 as it does", tuple(block), fp32)
    proc = TENSOR_PROCESSORS.get(arch, TensorProcessor).__name__
    if proc not in ROW_PROCESSORS:
        return HeldPlan(False, f"transformers' {proc} for {arch} does more than reorder rows; dequantized to fp32 as it does", tuple(block), fp32)
    # a file of floats only is read the same way (its weights cast at load, no fp32 copy first)
    unread = [t for t in block if not ggml_readable(t)]
    if unread:
        return HeldPlan(False, f"no per-layer dequantizer for ggml type {', '.join(unread)}; dequantized to fp32 as transformers does", tuple(block), fp32)
    return HeldPlan(True, "", tuple(block), fp32)


@contextmanager
def _name_maps_once() -> Iterator[None]:
    """gguf.get_tensor_name_map memoized for the duration: transformers'
    get_gguf_hf_weights_map builds the same map once per submodule (hundreds of times,
    seconds each for a real model); the map depends only on (architecture, layers)."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def load_gguf_held(path: Path, config: Any, dtype: torch.dtype, folder: Any = None) -> tuple[Any, dict[str, Any] | None]:
    """The GGUF's model with its decoder linears held as ggml blocks (-> model, record;
    record None when no layer is held: every weight a float). `config` is the model's
    config as the fp32 path writes it (load_info's)."""
    import copy

    from accelerate import init_empty_weights
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    where = folder or path
    plain = copy.deepcopy(config)
    if hasattr(plain, "quantization_config"):
        delattr(plain, "quantization_config")
    try:
        arch, tensors = read_tensors(path)
    except Exception as e:
        raise ModelLoadError(f"GGUF file {path} is corrupt or truncated ({type(e).__name__}: {str(e)[:80]})", "download or convert the file again") from e
    # the processor reads the head counts from the config transformers made of the file
    # (the same values as the model's config; the row-reordering processors read nothing else)
    parsed = {"config": plain.to_dict()}
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed["config"])
    with init_empty_weights(include_buffers=False):  # parameters on the meta device, buffers (rotary tables) real
        model = AutoModelForCausalLM.from_config(plain, dtype=dtype)
    with _name_maps_once():
        names = get_gguf_hf_weights_map(model, processor)
    inside = {id(m) for _, _, _, m in _decoder_linears(model)}
    linear_at = {f"{n}.weight": n for n, m in model.named_modules() if id(m) in inside}

    state: dict[str, torch.Tensor] = {}
    blocks: dict[str, tuple[torch.Tensor, str]] = {}  # module prefix -> (its rows of blocks, ggml type)
    for t in tensors:
        hf = names.get(t.name)
        if hf in linear_at and t.type not in FLOAT_GGML:
            # the processor's Q/K permutation reorders whole rows, so it applies to the rows of blocks
            done = processor.process(weights=t.raw, name=t.name, tensor_key_mapping=names, parsed_parameters=parsed)
            if names.get(done.name) != hf:
                raise ModelLoadError(f"{where}: transformers renames {t.name} while reordering it", "report this GGUF's architecture")
            blocks[linear_at[hf]] = (torch.from_numpy(np.array(done.weights, dtype=np.uint8, copy=True)), t.type)
            continue
        # as transformers' loader: the gguf package's dequantize, the processor, float32
        # values, cast to the compute dtype (the fp32 path casts when it loads them)
        done = processor.process(weights=dequantize(t.raw, GGMLQuantizationType[t.type]), name=t.name, tensor_key_mapping=names, parsed_parameters=parsed)
        if done.name not in names:
            continue
        state[names[done.name]] = torch.from_numpy(np.array(done.weights, dtype=np.float32, copy=True)).to(dtype)
    held: set[str] = set()
    for prefix, (rows, kind) in blocks.items():
        mod = model.get_submodule(prefix)
        bias = state.pop(prefix + ".bias", None)
        set_child(model, prefix, QuantLinear(mod.in_features, mod.out_features, "ggml", {"blocks": rows}, {"type": kind, "rows": mod.out_features, "cols": mod.in_features}, dtype, bias=bias, kind=kind))
        held.add(prefix)
    model = _load_state(model, state, plain, where, held)
    if not held:
        return model, None
    kinds = sorted({k for _, k in blocks.values()})
    ftype = _file_type(path)
    record: dict[str, Any] = {
        "weights": kinds[0] if len(kinds) == 1 else ftype or "mixed", "method": "checkpoint", "layers": len(held), "weight_rel_error": None,  # Q8_0; Q4_K_M for its Q4_K, Q6_K, Q5_0 layers
        "note": f"GGUF{f' {ftype}' if ftype else ''} ({', '.join(kinds)}): decoder linear weights held as their ggml blocks and dequantized per layer at each forward as transformers' GGUF loader dequantizes them; embeddings, norms and LM head dequantized at load: the served weights, not a simulation",
    }  # fmt: skip
    return model, record


_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L",
               14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}  # fmt: skip  # llama_ftype


def _file_type(path: Path) -> str:
    """The file's llama_ftype by name (Q4_K_M, …), '' when it names none."""
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata

        metadata, _ = read_gguf_metadata(str(path))
        return _FILE_TYPES.get(int(metadata.get("general.file_type", -1)), "")
    except (ImportError, ValueError, TypeError):
        return ""

