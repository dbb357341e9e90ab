"""`specprobe monitor`: acceptance health in production, from the serving engine's own metrics.

Layout (dependencies point down):
    promrules    `specprobe alerts`: Prometheus recording/alerting rules and a Grafana dashboard
    runner       the poll → window → rules → alerts loop, stale/backoff bookkeeping, drift windows
    live         rich rendering of a Snapshot (never computes anything)
    alerts       Alert records, firing/resolved transitions, JSON-lines sink
    grouprules   per-group thresholds (a rules file's `groups:`)
    sources      facade: every source kind below in one import
    http_source  /metrics scrapes over HTTP (URL check, GET, retries)
    prometheus   a Prometheus server's query API: server-side windows for a fleet
    requests     per-request records in JSON lines, grouped by a field
    logs         log lines from files or stdin
    exposition   /metrics text parsing and the map of an engine's names onto the series
    dialects     each engine's own monitoring knowledge, asked from the engines
  (engines/<engine>/monitor.py: that engine's metric names, log lines, request-record
   fields and alert-rule names; they read and write only the modules below)
    records      a log line's and a request's record, the per-source log state
    base         the store, the poll result, the transient SourceError
    drift        pure maths: trend (Theil–Sen, Mann–Kendall) and change point (CUSUM) over windows
    windows      pure maths: counters → windowed increases (with resets), acceptance stats

Nothing here imports torch or transformers.
"""
