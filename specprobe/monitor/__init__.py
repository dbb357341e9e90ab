"""`specprobe monitor`: acceptance health in production, from the serving engine's own metrics.

Layout (dependencies point down):
    runner       the poll → window → rules → alerts loop, stale/backoff bookkeeping
    live         rich rendering of a Snapshot (never computes anything)
    alerts       Alert records, firing/resolved transitions, JSON-lines sink
    sources      facade: every source kind below in one import
    http_source  /metrics scrapes over HTTP (URL check, GET, retries)
    prometheus   a Prometheus server's query API: server-side windows for a fleet
    logs         log lines (vLLM V1/V0, SGLang, llama.cpp) from files or stdin
    exposition   /metrics text parsing and the engines' metric-name maps
    base         the store, the poll result, the transient SourceError
    windows      pure maths: counters → windowed increases (with resets), acceptance stats

Nothing here imports torch or transformers.
"""
