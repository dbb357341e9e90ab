"""Parsers of the settings whose values are written as text: draft lengths (`1,2,4`),
batch sizes (`1,8,32`), a shard (`I/N`), memory per device (`0=70GiB,1=70GiB`) and a draft
tree (`steps=3,topk=4,tokens=8` or a JSON list of rank paths). Each raises ConfigError
naming where the value was written."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from specprobe.core.errors import ConfigError

# The longest draft the estimate and the simulate loop handle (flags and files alike).
K_LIMIT = 32


def parse_max_memory(text: str, where: str = "--max-memory") -> dict[Any, str]:
    """'0=70GiB,1=70GiB,cpu=200GiB' -> {0: '70GiB', 1: '70GiB', 'cpu': '200GiB'} (accelerate's form)."""
    out: dict[Any, str] = {}
    for item in filter(None, (x.strip() for x in str(text).split(","))):
        key, sep, size = item.partition("=")
        key, size = key.strip(), size.strip()
        if not sep or not size or not (key.isdigit() or key in ("cpu", "disk")):
            raise ConfigError(f"{where} {text!r}: {item!r} is not DEVICE=SIZE", "use e.g. --max-memory 0=70GiB,1=70GiB (GPU index or cpu = size)")
        out[int(key) if key.isdigit() else key] = size
    if not out:
        raise ConfigError(f"{where} {text!r} lists no device", "use e.g. --max-memory 0=70GiB,1=70GiB")
    return out


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: it owns the reference batches b with b % count == index."""

    index: int
    count: int

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str, where: str = "--shard") -> Shard:
    """'1/4' -> Shard(1, 4); ConfigError on anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m:
        raise ConfigError(f"{where} {text!r} is not I/N", "use e.g. --shard 0/4 (shards 0..N-1 of N)")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or i >= n:
        raise ConfigError(f"{where} {text!r} is out of range", f"the index runs from 0 to N-1: 0/{max(n, 1)} … {max(n, 1) - 1}/{max(n, 1)}")
    return Shard(i, n)


def parse_ks(text: str, where: str = "--k") -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique); ConfigError on anything else."""
    try:
        ks = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise ConfigError(f"{where} {text!r} is not a comma-separated list of integers", "use e.g. --k 1,2,4") from None
    if not ks or ks[0] < 1 or ks[-1] > K_LIMIT:
        raise ConfigError(f"{where} {text!r} must list draft lengths between 1 and {K_LIMIT}", "use e.g. --k 1,2,4")
    return ks


def parse_batch_sizes(text: str, where: str = "--batch-sizes") -> list[int]:
    """'1,8,32' -> [1, 8, 32] (sorted, unique); ConfigError on anything else."""
    try:
        sizes = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise ConfigError(f"{where} {text!r} is not a comma-separated list of integers", "use e.g. --batch-sizes 1,8,32") from None
    if not sizes or sizes[0] < 1:
        raise ConfigError(f"{where} {text!r} must list positive batch sizes", "use e.g. --batch-sizes 1,8,32")
    return sizes


def parse_tree(text: str, where: str = "--tree") -> str:
    """'steps=3,topk=4,tokens=8' or '[[0],[0,0],[1]]' -> the tree's canonical text (the
    dynamic label, or the static paths as compact JSON); ConfigError on anything else."""
    import json

    from specprobe.estimates.tree import parse

    try:
        shape = parse(str(text))
    except ValueError as e:
        raise ConfigError(f"{where} {str(text)!r}: {e}", "use e.g. --tree steps=3,topk=4,tokens=8 (SGLang's knobs) or a JSON list of rank paths such as '[[0],[0,0],[1]]'") from None
    return json.dumps([list(p) for p in shape.paths], separators=(",", ":")) if shape.static else shape.label()
