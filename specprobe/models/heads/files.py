"""A head checkpoint on disk: config.json plus tensor headers, read without loading weights.

`HeadFiles` knows every tensor's name, shape and dtype from the safetensors headers (or,
for an old `pytorch_model.bin`, from a memory-mapped load that touches no data), so a
layout can be recognised and validated in milliseconds; `load` reads only the tensors a
module needs. Every failure is a one-line ModelLoadError (exit code 2).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specprobe.core.errors import ModelLoadError

# FasterDecoding's training script writes the heads under this name next to config.json.
MEDUSA_FILE = "medusa_lm_head.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # safetensors' names: F32, BF16, I64, BOOL, …
    file: Path


@dataclass
class HeadFiles:
    """config.json (as a dict) and the tensor index of one checkpoint folder."""

    folder: Path
    config: dict[str, Any]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...] | None:
        t = self.tensors.get(name)
        return t.shape if t else None

    def with_prefix(self, prefix: str) -> list[str]:
        return [n for n in self.tensors if n.startswith(prefix)]

    def load(self, names: Iterable[str], device: Any = "cpu", dtype: Any = None) -> dict[str, Any]:
        """The named tensors (floating ones cast to dtype); a missing name is an error."""
        import torch

        by_file: dict[Path, list[str]] = {}
        for n in names:
            info = self.tensors.get(n)
            if info is None:
                raise ModelLoadError(f"{self.folder}: tensor {n} is missing", "the checkpoint is incomplete or in another layout")
            by_file.setdefault(info.file, []).append(n)
        out: dict[str, Any] = {}
        for path, group in by_file.items():
            try:
                if path.suffix == ".safetensors":
                    from safetensors import safe_open

                    with safe_open(str(path), framework="pt", device="cpu") as fh:
                        for n in group:
                            out[n] = fh.get_tensor(n)
                else:
                    sd = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
                    for n in group:
                        out[n] = sd[n]
            except ModelLoadError:
                raise
            except Exception as e:  # safetensors/torch raise their own types on damaged files
                raise ModelLoadError(f"cannot read {path}: {_first_line(e)}", "the file is corrupt or truncated; download or export it again") from e
        for n, t in out.items():
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            out[n] = t.to(device)
        return out


def _first_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:160]


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no config.json", "pass the folder that holds the head's config.json and weights")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {_first_line(e)}", "the file must be a JSON object") from e
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object", "the file must be a JSON object")
    return data


def _safetensors_index(path: Path) -> dict[str, TensorInfo]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            out = {}
            for n in fh.keys():  # noqa: SIM118  (safe_open is not a Mapping)
                sl = fh.get_slice(n)
                out[n] = TensorInfo(tuple(int(x) for x in sl.get_shape()), str(sl.get_dtype()), path)
            return out
    except Exception as e:  # SafetensorError on a truncated or corrupt header
        raise ModelLoadError(f"{path} is not a readable safetensors file ({_first_line(e)})", "the file is corrupt or truncated; download or export it again") from e


_TORCH_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32", "bool": "BOOL"}


def _torch_index(path: Path) -> dict[str, TensorInfo]:
    import torch

    try:
        # mmap: shapes come from the archive's metadata; no tensor data is read
        sd = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise ModelLoadError(f"{path} is not a readable PyTorch checkpoint ({_first_line(e)})", "the file is corrupt or truncated; download or export it again") from e
    if not isinstance(sd, dict):
        raise ModelLoadError(f"{path} does not hold a state dict", "pass a checkpoint saved with torch.save(model.state_dict())")
    return {n: TensorInfo(tuple(t.shape), _TORCH_DTYPES.get(str(t.dtype).removeprefix("torch."), str(t.dtype)), path) for n, t in sd.items() if hasattr(t, "shape")}


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a folder: *.safetensors, else pytorch_model*.bin / *.pt."""
    st = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    if st:
        return st
    return sorted(p for p in [*folder.glob("pytorch_model*.bin"), *folder.glob("*.pt")] if p.is_file())


def open_folder(folder: Path, config: dict[str, Any] | None = None) -> HeadFiles:
    """Config + tensor index of every weight file in the folder (headers only)."""
    files = weight_files(folder)
    index: dict[str, TensorInfo] = {}
    for p in files:
        index.update(_safetensors_index(p) if p.suffix == ".safetensors" else _torch_index(p))
    return HeadFiles(folder, read_config(folder) if config is None else config, index)
