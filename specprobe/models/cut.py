"""A layer-skip self-draft (`self:layers=N`: the target's first N decoder layers, its final
norm and LM head) written as a checkpoint folder of its own, so that an engine serves it as
an ordinary draft model (vLLM's `draft_model`, SGLang's STANDALONE, TensorRT-LLM's
DraftTarget; llama.cpp after converting it to GGUF). The engines have no layer-skip method;
the folder computes exactly what specprobe scored: the same weights, cut at layer N.

Only safetensors checkpoints are cut (a single file or shards with their index). The
folder is built beside its destination and renamed into place when whole.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from specprobe.core.errors import ModelLoadError

# a decoder layer's tensors, as the transformers architectures name them:
# model.layers.i. (Llama, Qwen, Mistral, Gemma…), transformer.h.i. (GPT-2, Falcon), gpt_neox.layers.i.
_LAYER = re.compile(r"^(?:[A-Za-z_]+\.)*(?:layers|h)\.(\d+)\.")
_SKIP = ("config.json", "model.safetensors.index.json", "specprobe-cache.json")
# config keys whose value is the layer count, by architecture
_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def layer_of(name: str) -> int | None:
    """The decoder layer a tensor belongs to (None: embedding, final norm, head…)."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def cut_config(cfg: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """`cfg` with N layers: the layer count, and every per-layer list (e.g. `layer_types`)
    cut to its first N entries; ModelLoadError where N is out of range."""
    key = next((k for k in _COUNT_KEYS if isinstance(cfg.get(k), int)), None)
    if key is None:
        raise ModelLoadError(f"the target's config.json names no layer count ({' / '.join(_COUNT_KEYS)})", "cut the checkpoint by hand and pass it as the drafter")
    total = int(cfg[key])
    if not 1 <= n_layers < total:
        raise ModelLoadError(f"self:layers={n_layers} is out of range for a target of {total} decoder layers", f"use 1 ≤ N < {total}")
    out = dict(cfg)
    out[key] = n_layers
    for k, v in cfg.items():
        if isinstance(v, list) and len(v) == total and k not in ("architectures",):
            out[k] = v[:n_layers]
    return out


def check_draft_folder(dst: Path) -> None:
    """Where a cut may be written: a new or empty folder, or one that holds a checkpoint
    (kept when it is the same cut); never a file or a folder of other files, which the
    atomic rename would replace (ModelLoadError, one line)."""
    if dst.is_file():
        raise ModelLoadError(f"{dst} is a file, not a folder to write the draft checkpoint into", "pass a new folder to --write-draft")
    if dst.is_dir() and not (dst / "config.json").is_file() and any(dst.iterdir()):
        raise ModelLoadError(f"{dst} is a folder that already holds files", "pass a new (or empty) folder to --write-draft")


def write_layer_cut(src: Path, dst: Path, n_layers: int) -> Path:
    """The checkpoint folder `src` cut to its first `n_layers` decoder layers, written to
    `dst` (same embedding, final norm, head and tokenizer files). Written whole or not at
    all; an existing complete `dst` of the same cut is kept."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from specprobe.models.loader import atomic_dir

    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{src} has no config.json: not a checkpoint folder to cut", "pass a transformers checkpoint folder as the target")
    cfg = cut_config(json.loads(cfg_path.read_text(encoding="utf-8")), n_layers)
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(f"{src} holds no *.safetensors: only safetensors checkpoints are cut", "save the target with save_pretrained(safe_serialization=True) and export again")
    check_draft_folder(dst)
    if (dst / "config.json").is_file():
        try:
            if json.loads((dst / "config.json").read_text(encoding="utf-8")) == cfg:
                return dst
        except ValueError:
            pass
        raise ModelLoadError(f"{dst} already holds another checkpoint", "pass a new folder to --write-draft, or remove that one")
    with atomic_dir(dst) as tmp:
        tensors: dict[str, Any] = {}
        for f in shards:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                    layer = layer_of(name)
                    if layer is None or layer < n_layers:
                        tensors[name] = fh.get_tensor(name).contiguous()
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        for f in src.iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name not in _SKIP:
                (tmp / f.name).write_bytes(f.read_bytes())
    return dst
