"""Is a GGUF dequantisation cache entry whole, and made from this GGUF file?

An entry (a safetensors checkpoint folder under <cache>/gguf/) is trusted only when its
marker `specprobe-cache.json` names the source file's sha256 (where the marker records
one), every file it lists has the size it had when written, every JSON file parses, and
every safetensors file's header accounts for the file's length exactly. That catches an
interrupted copy, a file cut short or overwritten, and a folder made from another model
or by another tool, without reading the 0.5 GB of weights. A byte flipped inside the
tensor data is not caught: that would take hashing every weight at every load.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

MARKER = "specprobe-cache.json"
FORMAT = 1
_MAX_HEADER = 100 << 20  # a safetensors header is JSON metadata, never near 100 MiB


def manifest(folder: Path, sha256: str, source: Path, created: float) -> dict[str, Any]:
    """The marker written last into a finished entry: what it was made from, and each
    file's size."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.name != MARKER}
    return {"format": FORMAT, "source": str(source), "sha256": sha256, "created": created, "files": files}


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{path.name} is {size} bytes, too short for a safetensors file"
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, size - 8):
            return f"{path.name} has no readable safetensors header"
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError):
            return f"{path.name} has no readable safetensors header"
    if not isinstance(header, dict):
        return f"{path.name} has no readable safetensors header"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        return f"{path.name} has a malformed safetensors header"
    if 8 + n + end != size:
        return f"{path.name} is {size} bytes, its header says {8 + n + end}"
    return None


def entry_problem(folder: Path, sha256: str, weights: bool = True) -> str | None:
    """Why the entry cannot be trusted (one phrase), or None when it can. weights=False:
    an entry of config and tokenizer only (a GGUF held as its blocks reads its weights
    from the file itself)."""
    try:
        meta = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {MARKER}"
    except (OSError, ValueError) as e:
        return f"its {MARKER} cannot be read ({type(e).__name__})"
    if not isinstance(meta, dict):
        return f"its {MARKER} is not an object"
    made_from = meta.get("sha256")
    if made_from is not None and made_from != sha256:
        return f"it was made from another file (sha256 {str(made_from)[:12]}…)"
    sizes = meta.get("files")
    if sizes is not None and not isinstance(sizes, dict):
        return f"its {MARKER} lists no files"
    for name, size in (sizes or {}).items():
        p = folder / str(name)
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != size:
            return f"{name} is {p.stat().st_size} bytes, {size} when written"
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "config.json is missing"
    except (OSError, ValueError) as e:
        return f"config.json cannot be read ({type(e).__name__})"
    if not isinstance(config, dict) or "model_type" not in config:
        return "config.json is not a transformers model config"
    files = sorted(folder.glob("*.safetensors"))
    if weights and not files:
        return "no safetensors weights"
    for p in sorted(folder.glob("*.json")):
        if p.name in (MARKER, "config.json"):
            continue
        try:
            json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return f"{p.name} cannot be read ({type(e).__name__})"
    for p in files:
        why = _safetensors_problem(p)
        if why:
            return why
    return None
