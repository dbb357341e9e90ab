"""Benchmark a head's live KV cache (`models.heads.live.KVList`, a buffer that doubles)
against a `torch.cat` per append, the cache it replaced: L single-token appends, each
followed by reading the live keys/values as attention does, in interleaved rounds.

Prints median (min–max) seconds per generation and the ratio; asserts nothing.
Run: python benchmarks/bench_kvcache.py [--length 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch


class ConcatKV(list):  # type: ignore[type-arg]
    """The replaced cache: one entry, re-concatenated on every append."""

    def append(self, kv: Any) -> None:
        if self:
            self[0] = (torch.cat([self[0][0], kv[0]], dim=2), torch.cat([self[0][1], kv[1]], dim=2))
        else:
            super().append(kv)


def generation(cache: Any, steps: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    t0 = time.perf_counter()
    for kv in steps:
        cache.append(kv)
        keys, _ = cache[0]  # the live part, as attention reads it
        assert keys.shape[2] > 0
    return time.perf_counter() - t0


def main() -> None:
    from specprobe.models.heads.live import KVList

    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    steps = [(torch.randn(a.batch, a.heads, 1, a.head_dim, generator=g), torch.randn(a.batch, a.heads, 1, a.head_dim, generator=g)) for _ in range(a.length)]
    times: dict[str, list[float]] = {"buffer": [], "concat": []}
    for _ in range(a.rounds):  # interleaved A/B
        times["buffer"].append(generation(KVList(), steps))
        times["concat"].append(generation(ConcatKV(), steps))
    for name, ts in times.items():
        print(f"{name:7s} {statistics.median(ts):.4f} s ({min(ts):.4f}–{max(ts):.4f}) for {a.length} appends, [B={a.batch}, heads={a.heads}, D={a.head_dim}]")
    print(f"concat ÷ buffer: {statistics.median(times['concat']) / statistics.median(times['buffer']):.1f}×")


if __name__ == "__main__":
    main()
