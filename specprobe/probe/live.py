"""`diagnose --against URL`: predicted against served, the last triage step.

Once the drafter is right, what can still lose acceptance is the serving stack. The run's
own prompts — the same token ids, chat template applied, that it scored — go to the
user's live server with the run's sampling and seeds, and each request's own counters are
kept. Where the answer carries them (vLLM started with `--per-request-spec-decode-metrics
summary|detailed`), the first request goes alone and the rest `IN_FLIGHT` at a time, each
counted by its own answer, whatever else the server serves meanwhile. Otherwise they go
one at a time and each is the delta of the server's totals (/metrics) across it, so no
other traffic may reach the server while it runs. The server's accepted ÷ drafted, and its
per-position rates, are set beside what the pair predicts for that engine at the
server's K, each with a standard error over prompts:

    predicted  the renewal estimate's expected counters (the same figures as the K table's
               accept_rate_renewal), standard error from their spread over prompts
               (`Accumulator.renewal_se`);
    served     Σ accepted ÷ Σ drafted over the requests, standard error over requests
               (one request is one prompt: a ratio estimator's linearised variance).

gap_rel = (served − predicted) ÷ predicted; z = (served − predicted) ÷ √(se_p² + se_s²).
The rules (SP7xx) read both: served far below the prediction's band means the stack loses
acceptance the drafter has (config drift, sampling set twice, the engine's release and its
known bugs); far above means the prediction is pessimistic, by gap_rel.

Bounded: every request has a timeout, the whole exchange a deadline; Ctrl-C or a server
that dies part-way keeps what was measured and says so."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specprobe.core.errors import ConfigError, ServerError
from specprobe.core.progress import Progress
from specprobe.engines import get
from specprobe.engines.base import LiveServer, SpecCounters
from specprobe.engines.http import IN_FLIGHT, in_order
from specprobe.metrics.accumulate import Accumulator
from specprobe.metrics.sampling import Sampling
from specprobe.result.run import counting

REQUEST_TIMEOUT_S = 300.0  # one completion


@dataclass
class LiveRun:
    """What the server measured: one counters delta per request, in prompt order."""

    url: str
    model: str
    engine: str
    version: str | None
    requests: list[SpecCounters] = field(default_factory=list)
    prompts: int = 0  # prompts there were to send
    stopped: str | None = None  # why fewer than all were sent (deadline, Ctrl-C, a server error)
    counted_by: str = "totals"  # "response": each answer's own counters; "totals": /metrics' delta across it
    in_flight: int = 1  # requests sent at once after the first

    @property
    def total(self) -> SpecCounters:
        out = SpecCounters(0.0, 0.0, 0.0, ())
        for r in self.requests:
            out = SpecCounters(out.drafts + r.drafts, out.draft_tokens + r.draft_tokens, out.accepted + r.accepted,
                               tuple(a + b for a, b in zip(_pad(out.per_pos, len(r.per_pos)), _pad(r.per_pos, len(out.per_pos)), strict=True)))
        return out

    @property
    def k(self) -> int | None:
        """The K the server drafts: draft tokens ÷ drafts (vLLM drafts K every round)."""
        t = self.total
        return round(t.draft_tokens / t.drafts) if t.drafts else None


def _pad(xs: tuple[float, ...], n: int) -> tuple[float, ...]:
    return xs + (0.0,) * max(0, n - len(xs))


def sampling_request(s: Sampling) -> dict[str, float]:
    """The target's sampling as a request states it (greedy: temperature 0)."""
    return {"temperature": 0.0 if s.greedy else s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p}


def connect(engine: str, url: str, model: str | None) -> LiveServer:
    """The live server, checked before any compute: it answers, serves the model, and
    reports speculative decoding."""
    server = get(engine).live_server(url, model)
    server.counters()  # no speculative decoding, or no metrics: said now, not after the scoring
    return server


def send(server: LiveServer, encoded: list[list[int]], sampling: Sampling, max_new_tokens: int, seed: int, deadline_s: float, progress: Progress,
         in_flight: int = IN_FLIGHT) -> LiveRun:
    """Every prompt once, each request's counters kept in prompt order (see the module's
    docstring for how they are counted). Stops at the deadline, on Ctrl-C or on a server
    error, keeping what it measured."""
    run = LiveRun(server.url, server.model, server.engine.name, server.version, prompts=len(encoded))
    request = sampling_request(sampling)
    start = time.monotonic()

    def left() -> float:
        return deadline_s - (time.monotonic() - start)

    def ask(i: int) -> SpecCounters | None:
        return server.complete_counted(encoded[i], max_new_tokens, request, seed + i, timeout=max(1.0, min(REQUEST_TIMEOUT_S, left())))[1]

    def late(i: int) -> bool:
        if left() > 0:
            return False
        run.stopped = f"the deadline ({deadline_s:g} s, --against-timeout) passed after {i} of {len(encoded)} prompts"
        return True

    try:
        before = server.counters()
        with progress.task(f"the run's {len(encoded)} prompts on {server.engine.label} at {server.url}", len(encoded)) as advance:
            own: SpecCounters | None = None
            for i in range(len(encoded)):
                if late(i):
                    break
                own = ask(i)
                now = server.counters()
                run.requests.append(own if own is not None else now - before)
                before = now
                advance()
                if own is not None:
                    break  # the answers count themselves: the rest go several at a time
            if own is not None and len(run.requests) < len(encoded):
                run.counted_by, run.in_flight = "response", in_flight
                rest = range(len(run.requests), len(encoded))
                with contextlib.closing(in_order(lambda i: (i, ask(i)), rest, in_flight, leave_behind=True)) as answers:
                    for i, counted in answers:
                        if counted is None:
                            raise ServerError(f"{server.engine.label} at {server.url} answered prompt {i + 1} without its own counters, as it had the first",
                                              "check that one server (not a mix behind a balancer) answers the URL")
                        run.requests.append(counted)
                        advance()
                        if len(run.requests) < len(encoded) and late(len(run.requests)):
                            break
            elif own is not None:
                run.counted_by = "response"
    except KeyboardInterrupt:
        run.stopped = f"interrupted after {len(run.requests)} of {len(encoded)} prompts"
    except ServerError as e:
        if not run.requests:
            raise
        run.stopped = f"the server failed after {len(run.requests)} of {len(encoded)} prompts: {e.one_line()}"
    return run


def _ratio_se(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """(Σ num ÷ Σ den, its standard error over the units), units as independent."""
    n = len(num)
    total = float(den.sum())
    if n < 1 or total <= 0:
        return math.nan, math.nan
    r = float(num.sum()) / total
    if n < 2:
        return r, math.nan
    return r, math.sqrt(n / (n - 1) * float(((num - r * den) ** 2).sum())) / total


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def compare(run: LiveRun, acc: Accumulator, sampling: Sampling) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[str]]]:
    """The live run beside the prediction -> (the result's `live` section, its metrics,
    their evidence)."""
    k = run.k
    if k is None:
        raise ConfigError(f"the server at {run.url} drafted nothing over {len(run.requests)} requests", "check that its speculative decoding is on for this model, and that the prompts leave room for max_new_tokens")
    if k > acc.k_max:
        raise ConfigError(f"the server drafts K = {k} but this run estimated up to K = {acc.k_max}", f"rerun with --k-max {k} (or more)")
    t = run.total
    a = np.array([r.accepted for r in run.requests])
    d = np.array([r.draft_tokens for r in run.requests])
    drafts = np.array([r.drafts for r in run.requests])
    served, served_se = _ratio_se(a, d)
    pos = [_ratio_se(np.array([_pad(r.per_pos, k)[i] for r in run.requests]), drafts) for i in range(k)]

    rate_se, _ = acc.renewal_se()
    with np.errstate(invalid="ignore", divide="ignore"):
        predicted = float(acc.renewal_accepted[k - 1].sum() / acc.renewal_drafted[k - 1].sum())
    predicted_pos, predicted_pos_se = acc.renewal_per_position(k)
    predicted_se = float(rate_se[k - 1])
    both = math.sqrt(predicted_se**2 + served_se**2) if not (math.isnan(predicted_se) or math.isnan(served_se)) else math.nan
    gap = served - predicted
    gap_rel = gap / predicted if predicted > 0 else math.nan
    z = gap / both if both and both > 0 else math.nan

    engine = get(run.engine)
    issues = [b for b in engine.known_bugs if b.may_affect(run.version, 0.0 if sampling.greedy else sampling.temperature)]
    metrics = {
        "live_accept_rate": _num(served),
        "live_accept_rate_predicted": _num(predicted),
        "live_gap_rel": _num(gap_rel),
        "live_gap_z": _num(z),
        "live_known_issue": int(bool(issues)),
    }
    said = f"{engine.label} {run.version or '(release unknown)'} at {run.url} serving {run.model}, K = {k}, {len(run.requests)} of {run.prompts} prompts ({counting(run.counted_by, run.in_flight)}), {sampling.describe()}"
    lines = [
        f"served {served:.4f} ± {served_se:.4f} (accepted {t.accepted:g} of {t.draft_tokens:g} drafted, {t.drafts:g} drafts); "
        f"predicted {predicted:.4f} ± {predicted_se:.4f} (the renewal estimate at K = {k}); gap {gap_rel:+.1%}, {z:+.1f} standard errors",
        said,
    ]
    if run.stopped:
        lines.append(f"stopped early: {run.stopped}")
    evidence = {"live_accept_rate": lines, "live_gap_rel": lines, "live_gap_z": lines}
    if issues:
        evidence["live_known_issue"] = [f"{b.name} ({engine.label} {', '.join(b.versions)}{' on ' + b.platform if b.platform else ''}, {b.condition}): {b.effect} — {b.workaround}" for b in issues]
    else:
        evidence["live_known_issue"] = [f"no known issue of {engine.label} {run.version or '(release unknown)'} at this temperature"]
    section = {
        "url": run.url,
        "model": run.model,
        "engine": run.engine,
        "engine_version": run.version,
        "k": k,
        "prompts": run.prompts,
        "requests": len(run.requests),
        "counted_by": run.counted_by,
        "in_flight": run.in_flight,
        "stopped": run.stopped,
        "drafts": t.drafts,
        "draft_tokens": t.draft_tokens,
        "accepted": t.accepted,
        "accept_rate": _num(served),
        "accept_rate_se": _num(served_se),
        "per_position": [_num(p[0]) for p in pos],
        "per_position_se": [_num(p[1]) for p in pos],
        "predicted_accept_rate": _num(predicted),
        "predicted_accept_rate_se": _num(predicted_se),
        "predicted_per_position": [_num(x) for x in predicted_pos],
        "predicted_per_position_se": [_num(x) for x in predicted_pos_se],
        "gap_rel": _num(gap_rel),
        "gap_z": _num(z),
        "known_issues": [b.name for b in issues],
    }
    return section, metrics, evidence
