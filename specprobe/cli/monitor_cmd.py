"""`specprobe monitor`: acceptance health in production from the serving engine's metrics."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from specprobe.cli.common import (
    err,
    handle_errors,
    takes_settings,
)
from specprobe.core.errors import ConfigError, InputError
from specprobe.settings.model import OUTPUTS_PANEL, RECORDS, SOURCES, WINDOWS, check


def _build_sources(urls: list[str], prometheus: str | None, logs: list[str], engine: str, timeout: float, retries: int, follow: bool,
                   requests: list[str] | None = None, group_by: str | None = None, num_spec_tokens: int | None = None,
                   time_field: str | None = None, per_engine: bool = False) -> list[Any]:
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.monitor.requests import RequestSource
    from specprobe.monitor.sources import LogSource, PrometheusSource, ScrapeSource

    sources: list[Any] = [ScrapeSource(u, engine=engine, timeout=timeout, retries=retries, per_engine=per_engine) for u in urls]
    if prometheus:
        sources.append(PrometheusSource(prometheus, engine=engine, timeout=timeout, retries=retries))
    requests = requests or []
    if (logs + requests).count("-") > 1:
        raise ConfigError("stdin ('-') given more than once to --log/--requests", "stdin can be read once")
    sources.extend(LogSource(p, follow=follow) for p in logs)
    sources.extend(RequestSource(p, follow=follow, group_by=group_by, num_spec_tokens=num_spec_tokens, time_field=time_field) for p in requests)
    return sources


@takes_settings("monitor")
@handle_errors
def monitor(
    url: Annotated[list[str] | None, typer.Option("--url", help="An engine's /metrics endpoint (vLLM V1/V0, SGLang or llama.cpp's server); repeatable.", rich_help_panel=SOURCES)] = None,
    prometheus: Annotated[str | None, typer.Option("--prometheus", help="A Prometheus server (http://host:9090) scraping the engines: the whole fleet, per model_name.", rich_help_panel=SOURCES)] = None,
    log: Annotated[list[str] | None, typer.Option("--log", help="A log file with the engines' spec-decode lines, or '-' for stdin; repeatable.", rich_help_panel=SOURCES)] = None,
    requests: Annotated[list[str] | None, typer.Option("--requests", help="Per-request records, one JSON object a line (a gateway's log, saved responses), or '-' for stdin: vLLM's metrics.speculative_decoding, SGLang's meta_info spec_*, llama.cpp's timings.draft_n*, found anywhere in the line; repeatable.", metavar="FILE|-", rich_help_panel=SOURCES)] = None,
    group_by: Annotated[str | None, typer.Option("--group-by", help="With --requests: a field of each line (dotted path: task, metadata.tenant) to group by; every group gets its own row, windows and alerts, beside the row of all requests.", metavar="FIELD", rich_help_panel=RECORDS)] = None,
    time_field: Annotated[str | None, typer.Option("--time-field", help="With --requests: the field holding each request's time (epoch seconds or ms, ISO 8601); default ts, timestamp, time, then the response's created.", metavar="FIELD", rich_help_panel=RECORDS)] = None,
    request_threshold: Annotated[float, typer.Option("--request-threshold", min=0.0, max=1.0, help="With --requests: the per-request acceptance under which a request counts as poor (the share of such requests is shown and is monitor_requests_below_share).", rich_help_panel=RECORDS)] = 0.5,
    per_engine: Annotated[bool, typer.Option("--per-engine", help="With --url on vLLM under data parallelism: a row per engine label beside each model's sum.", rich_help_panel=SOURCES)] = False,
    drift_window: Annotated[str | None, typer.Option("--drift-window", help="Look for drift (a slow fall, a change point) over this much of the run, e.g. 6h (default: all of it that was seen).", metavar="DURATION", rich_help_panel=WINDOWS)] = None,
    engine: Annotated[str, typer.Option("--engine", help="auto | vllm | sglang | llamacpp: which engine's metric names to read.", rich_help_panel=SOURCES)] = "auto",
    window: Annotated[str, typer.Option("--window", help="Sliding window for the current rates (300s, 5m, 1h), or with --requests a count of drafted tokens (100tok: the newest whole requests holding them).", rich_help_panel=WINDOWS)] = "5m",
    baseline_window: Annotated[str | None, typer.Option("--baseline-window", help="Trailing baseline window, just before the current one (default 1h; with --window Ntok, 10 × N tokens).", rich_help_panel=WINDOWS)] = None,
    interval: Annotated[str | None, typer.Option("--interval", help="Time between polls (default 15s; 2s with --once).", rich_help_panel=WINDOWS)] = None,
    once: Annotated[bool, typer.Option("--once", help="Evaluate one window and exit: 0 healthy, 1 alert (cron/CI). Counters need two scrapes, --interval apart.", rich_help_panel=WINDOWS)] = False,
    alerts: Annotated[Path | None, typer.Option("--alerts", help="Append alerts as JSON lines to this file (default: stdout).", rich_help_panel=OUTPUTS_PANEL)] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="With --once (or log files read to the end): write the evaluated window as JSON — per model accepted and drafted tokens, drafts, rates.", metavar="FILE", show_default=False, rich_help_panel=OUTPUTS_PANEL)] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep reading --log files (and stdin) as they grow.", rich_help_panel=SOURCES)] = False,
    num_spec_tokens: Annotated[int | None, typer.Option("--num-spec-tokens", min=1, help="Draft length K, to turn a mean acceptance length into a rate where the source has no draft-token count (SGLang without accept rate).", rich_help_panel=SOURCES)] = None,
    timeout: Annotated[str, typer.Option("--timeout", help="Per-request HTTP timeout.", rich_help_panel=SOURCES)] = "5s",
    retries: Annotated[int, typer.Option("--retries", min=0, help="Retries per poll, with doubling backoff, before a source is shown stale.", rich_help_panel=SOURCES)] = 2,
    live: Annotated[bool, typer.Option("--live/--no-live", help="Live terminal view on stderr (only when it is a terminal).", rich_help_panel=OUTPUTS_PANEL)] = True,
    rules: list[Path] | None = None,
    fail_on: str = "warning",
) -> None:
    """Watch speculative-decoding acceptance in production and alert on SP4xx rules.

    Per model_name: acceptance rate (accepted ÷ drafted tokens), mean acceptance length
    (1 + accepted ÷ drafts, bonus token included), per-position rates — over a sliding
    window against the trailing baseline. Alerts go out as JSON lines.

    Examples:
      specprobe monitor --url http://127.0.0.1:8000/metrics

      specprobe monitor --prometheus http://prometheus:9090 --window 5m --baseline-window 1h --alerts alerts.jsonl

      specprobe monitor --log vllm.log --once            (cron/CI: exit 0 healthy, 1 alert, 2 bad input)

      specprobe monitor --url http://127.0.0.1:8080/metrics --once --json window.json   (llama-server --metrics)

      kubectl logs -f deploy/sglang | specprobe monitor --log - --follow --num-spec-tokens 4

      specprobe monitor --requests gateway.jsonl --group-by task --window 100tok --rules rules/monitor-mtp.yaml
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.judge.rules import load_table
    from specprobe.monitor.dialects import engine_choices
    from specprobe.monitor.grouprules import read_overrides
    from specprobe.monitor.requests import check_field_path
    from specprobe.monitor.runner import Monitor
    from specprobe.monitor.windows import parse_duration, parse_window

    check("fail_on", fail_on, "--fail-on")
    if engine not in engine_choices():
        raise ConfigError(f"unknown --engine {engine!r}", "use " + ", ".join(engine_choices()))
    urls, logs, reqs = list(url or []), list(log or []), list(requests or [])
    win_s, win_tok = parse_window(window, "--window")
    win = 60.0 if win_s is None else win_s
    if win_tok is not None:
        if urls or prometheus or logs:
            raise ConfigError(f"--window {window} counts tokens, which only per-request records carry", "use --requests FILE alone with a token window, or a duration (5m) with --url/--prometheus/--log")
        base_tok = 10 * win_tok
        if baseline_window is not None:
            _, base_tok_given = parse_window(baseline_window, "--baseline-window")
            if base_tok_given is None:
                raise ConfigError(f"--baseline-window {baseline_window} is a duration but --window {window} counts tokens", "give both as tokens, e.g. --window 100tok --baseline-window 1000tok")
            base_tok = base_tok_given
        base = 3600.0  # unused by token windows; keeps the runner's bookkeeping finite
    else:
        base_tok = None
        base = parse_duration(baseline_window or "1h", "--baseline-window")
    if group_by is not None:
        if not reqs:
            raise ConfigError("--group-by needs --requests", "pass --requests FILE: only per-request records carry a task or tenant field")
        check_field_path(group_by, "--group-by")
    if time_field is not None:
        check_field_path(time_field, "--time-field")
    drift_span = parse_duration(drift_window, "--drift-window") if drift_window else None
    tmo = parse_duration(timeout, "--timeout")
    ivl = parse_duration(interval, "--interval") if interval else (2.0 if once else 15.0)
    if not urls and not prometheus and not logs and not reqs:
        raise ConfigError("no source to monitor", "pass --url http://host:port/metrics, --prometheus http://host:9090, --log FILE or --requests FILE")
    if urls and ivl >= win:
        raise ConfigError(f"--interval ({ivl:g}s) must be shorter than --window ({win:g}s)", "a window needs at least two scrapes")
    table = load_table(rules or [])
    overrides = read_overrides(rules or [], table)
    if per_engine and not urls:
        raise ConfigError("--per-engine needs --url", "the engine label is read from a vLLM /metrics endpoint")
    sources = _build_sources(urls, prometheus, logs, engine, tmo, retries, follow, reqs, group_by, num_spec_tokens, time_field, per_engine)
    # Finite inputs (log and request files read to the end) are evaluated once, at their last line.
    finite = all(s.kind in ("log", "requests") for s in sources) and not follow
    if json_out is not None and not (once or finite):
        raise ConfigError("--json needs --once (or log files read to the end)", "add --once, or drop --json and use --alerts")
    from specprobe.core.files import check_writable_file

    check_writable_file(json_out, "--json")
    mon = Monitor(
        sources, table, window=win, baseline=base, interval=ivl, num_spec_tokens=num_spec_tokens,
        warn=lambda msg: err.print(f"[yellow]warning:[/] {msg}", highlight=False, soft_wrap=True),
        window_tokens=win_tok, baseline_tokens=base_tok, request_threshold=request_threshold,
        drift_span=drift_span, group_overrides=overrides,
    )
    from specprobe.monitor.alerts import AlertSink

    sink = AlertSink(alerts)
    try:
        if once or finite:
            raise typer.Exit(_run_once(mon, sink, ivl, fail_on, json_out))
        _run_loop(mon, sink, ivl, live and err.is_terminal)
    finally:
        sink.close()
        for s in sources:
            if hasattr(s, "close"):
                s.close()


def _run_once(mon: Any, sink: Any, interval: float, fail_on: str, json_out: Path | None = None) -> int:
    import json

    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.files import write_text_atomic
    from specprobe.judge.rules import exit_code_for
    from specprobe.monitor.live import render

    mon.poll(time.time())
    if any(s.kind == "scrape" for s in mon.sources):
        time.sleep(interval)  # counters: a rate needs a second scrape
        mon.poll(time.time())
    snap = mon.evaluate(time.time(), anchor_to_data=True)
    if not snap.has_data:
        detail = "; ".join(f"{st.name}: {st.last_error or st.state}" + (f" (missing {', '.join(st.missing)})" if st.missing else "") for st in snap.sources)
        raise InputError(f"no acceptance data from any source ({detail})", "check the URL/file and that speculative decoding is enabled and serving traffic")
    err.print(render(snap, title="specprobe monitor --once"))
    for note in short_log_notes(mon, snap):
        err.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    if json_out is not None:
        write_text_atomic(json_out, json.dumps(snap.to_dict(), indent=2) + "\n")
    sink.write(list(snap.alerts))
    return exit_code_for([f for m in snap.models for f in m.findings], fail_on)


def _run_loop(mon: Any, sink: Any, interval: float, use_live: bool) -> None:
    from rich.live import Live

    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.monitor.live import render
    from specprobe.monitor.runner import summary_lines

    snap = None
    live = Live(console=err, refresh_per_second=4, transient=False) if use_live else None
    try:
        with live if live is not None else contextlib.nullcontext():
            while True:
                tick = time.time()
                mon.poll(tick)
                snap = mon.evaluate(tick)
                sink.write(mon.transitions(snap))
                if live is not None:
                    live.update(render(snap))
                if all(s.kind in ("log", "requests") and getattr(s, "_eof", False) for s in mon.sources):
                    break  # stdin closed: nothing more will come
                time.sleep(max(0.0, tick + interval - time.time()))
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/] — summary:")
    for line in summary_lines(snap, mon):
        err.print(line, highlight=False, soft_wrap=True)
    for note in old_log_notes(mon, snap):
        err.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)


def _span(data: Any) -> float | None:
    """Seconds between a model's first and last observation (None: no raw samples, e.g.
    a Prometheus server that computed the windows itself)."""
    firsts = [pts[0][0] for pts in (*data.counters.values(), *data.events.values(), *data.gauges.values()) if pts]
    if not firsts or data.last_time is None:
        return None
    return data.last_time - min(firsts)


def _ago(seconds: float) -> str:
    """A human age: '3 days', '5h 10m', '7m 30s', '12s'."""
    s = int(round(seconds))
    if s >= 2 * 86400:
        return f"{s // 86400} days"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60}m"
    if s >= 60:
        return f"{s // 60}m {s % 60}s"
    return f"{s}s"


def short_log_notes(mon: Any, snap: Any) -> list[str]:
    """--once on a log shorter than window + baseline: what the baseline holds (nothing,
    or less than asked) and what to pass instead."""
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.monitor.live import duration

    notes: list[str] = []
    if mon.window_tokens is not None:
        return notes
    for m in snap.models:
        span = _span(mon.store[m.model]) if m.model in mon.store else None
        if span is None or span >= mon.window + mon.baseline:
            continue
        span = round(span)
        if span <= mon.window:
            half = duration(max(1, span // 2))
            notes.append(
                f"model {m.model}: the log spans {_ago(span)}, no longer than the {duration(mon.window)} window, so there is no baseline "
                f"to compare with; pass e.g. --window {half} --baseline-window {half} to split what there is"
            )
        else:
            held = span - mon.window
            notes.append(
                f"model {m.model}: the log spans {_ago(span)}, shorter than the {duration(mon.window)} window plus the {duration(mon.baseline)} "
                f"baseline before it: the baseline holds only {_ago(held)}; pass --baseline-window {duration(held)} to say so, or give a longer log"
            )
    return notes


def old_log_notes(mon: Any, snap: Any) -> list[str]:
    """A followed log whose lines are all older than the window (a finished log piped in):
    why acceptance is n/a, and what to pass."""
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.monitor.live import duration

    if snap is None:
        return []
    notes = []
    for m in snap.models:
        data = mon.store.get(m.model)
        if data is None or data.last_time is None or not m.now.empty or snap.t - data.last_time <= mon.window:
            continue
        age = snap.t - data.last_time
        what = "record" if data.requests else "log line"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data.last_time))
        notes.append(
            f"model {m.model}: acceptance is n/a because its newest {what} ({when}, {_ago(age)} ago) is older than the "
            f"{duration(mon.window)} window, which ends now; for a finished log drop --follow (or use --once): the windows then end at "
            f"the log's last line"
        )
    return notes


def register(app: typer.Typer) -> None:
    app.command("monitor")(monitor)
