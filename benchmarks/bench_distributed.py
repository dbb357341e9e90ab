"""2 ranks vs 1 rank wall time for `diagnose` on the same prompts (torchrun, gloo on the
CPU), each in a fresh process with a fresh cache (references generated in both).

On a 2-core machine two ranks share the cores (each rank gets OMP_NUM_THREADS=1), so
the ratio says how much of the run parallelises, not what a multi-GPU job gains.
Prints the times and the ratio; nothing is asserted.
Run: python benchmarks/bench_distributed.py [--prompts 16] [--target smollm2]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(ranks: int, args: argparse.Namespace) -> float:
    cache = tempfile.mkdtemp(prefix="specprobe-bench-")
    threads = max(1, (os.cpu_count() or 1) // ranks)
    env = {**os.environ, "SPECPROBE_CACHE_DIR": cache, "OMP_NUM_THREADS": str(threads)}
    # the dequantised GGUF is shared, so neither side pays the conversion
    if "SPECPROBE_GGUF_CACHE" in os.environ:
        env["SPECPROBE_CACHE_DIR"] = os.environ["SPECPROBE_GGUF_CACHE"]
    diag = ["-m", "specprobe", "diagnose", args.target, args.drafter, "--max-prompts", str(args.prompts), "--max-new-tokens", str(args.tokens),
            "--temperature", "0.7", "--cost-ratio", "0.5", "--verify-factor", "1.0", "--device", "cpu", "--brief", "--fail-on", "never", "--json", os.path.join(cache, "r.json"), "--no-cache"]
    cmd = [sys.executable, *diag] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1", "--master-port", str(_port()), *diag]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--drafter", default="self:layers=24")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    one = run(1, args)
    many = run(args.ranks, args)
    print(f"diagnose {args.target} vs {args.drafter}, {args.prompts} prompts × ≤{args.tokens} tokens, CPU ({os.cpu_count()} cores), wall time incl. start-up and model load:")
    print(f"  1 rank   {one:7.1f} s")
    print(f"  {args.ranks} ranks  {many:7.1f} s   ratio {many / one:.2f}  (1.00 = no gain; {1 / args.ranks:.2f} = perfect)")
