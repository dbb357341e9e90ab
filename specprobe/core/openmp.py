"""How long torch's idle OpenMP threads spin, for specprobe's own processes.

After each parallel region (a matmul, a large sum), GNU OpenMP — the runtime torch's CPU
build uses — keeps its worker threads spinning on their cores for a while (300,000
rounds of a pause instruction by default: milliseconds on recent CPUs) before they sleep.
The scorer's compiled rows (`metrics.kernel`) run on Python threads of their own right
after the LM head's matmul, and on a spinning core they get half of it. A shorter spin
(GOMP_SPINCOUNT=10000) leaves torch's own back-to-back regions as fast and frees the cores
sooner: in benchmarks/bench_diagnose.py on a 2-core machine the metrics took 37–38 ms
against 40–43 ms (medians of two runs each; the forward unchanged within its noise).

Set by the `specprobe` command before torch loads (OpenMP reads it once, at start), never
over a user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY; a library caller's process is left
as it is."""

from __future__ import annotations

import os

SPIN_COUNT = "10000"


def shorten_spin(environ: dict[str, str] | None = None) -> bool:
    """Set GOMP_SPINCOUNT unless the user chose a spin count or wait policy; True if set."""
    env = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" in env or "OMP_WAIT_POLICY" in env:
        return False
    env["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True
