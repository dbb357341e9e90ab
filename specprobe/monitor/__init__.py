"""`specprobe monitor`: acceptance health in production, from the serving engine's own metrics.

Layout (dependencies point down):
    runner   the poll → window → rules → alerts loop, stale/backoff bookkeeping
    live     rich rendering of a Snapshot (never computes anything)
    alerts   Alert records, firing/resolved transitions, JSON-lines sink
    sources  /metrics scrapes (vLLM V1/V0, SGLang), Prometheus query API, log lines
    windows  pure maths: counters → windowed increases (with resets), acceptance stats

Nothing here imports torch or transformers.
"""
