"""diagnose --against, without a real server: vLLM's counters as its 0.32.0 CPU build
writes them (a captured /metrics), the standard errors on both sides, the comparison and
its rules, and the client's one-line errors against a loopback stand-in. The real vLLM
runs in tests/test_vllm.py (the rule fires with the CPU expand bug, not without it)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specprobe.core.errors import ConfigError, ServerError
from specprobe.core.progress import Progress
from specprobe.engines import get
from specprobe.engines.base import SpecCounters
from specprobe.engines.vllm import CPU_EXPAND_KERNEL
from specprobe.engines.vllm.client import counters_from_text
from specprobe.judge.rules import load_table
from specprobe.metrics.accumulate import FIELDS, Accumulator
from specprobe.metrics.sampling import Sampling
from specprobe.probe import live
from tests.helpers import loopback_stub

DATA = Path(__file__).parent / "data" / "vllm"


def _acc(seed: int = 0, prompts: int = 30, k_max: int = 4) -> Accumulator:
    rng = np.random.default_rng(seed)
    acc = Accumulator(k_max=k_max, drafting="greedy")
    for _ in range(prompts):
        n = int(rng.integers(20, 60))
        vals = {f: np.full(n, 0.5) for f in FIELDS}
        vals["accept_prob_greedy_draft"] = np.clip(rng.normal(rng.uniform(0.1, 0.9), 0.2, n), 0, 1)
        acc.add_sequence("chat", np.arange(n), vals)
    return acc


def _run(per_request: list[tuple[float, float, float, tuple[float, ...]]], version: str | None = "0.32.0") -> live.LiveRun:
    run = live.LiveRun("http://127.0.0.1:1", "target", "vllm", version, prompts=len(per_request))
    run.requests = [SpecCounters(*r) for r in per_request]
    return run


def test_vllm_counters_as_its_cpu_build_writes_them() -> None:
    c = counters_from_text((DATA / "metrics-0.32.0-cpu.txt").read_text())
    assert (c.drafts, c.draft_tokens, c.accepted) == (23.0, 92.0, 0.0)
    assert c.per_pos == (0.0, 0.0, 0.0, 0.0)  # one counter per position (K = 4), 0-based labels
    assert c.accept_rate == 0.0 and math.isnan(SpecCounters(0, 0, 0).accept_rate)


def test_counters_sum_label_sets_and_subtract() -> None:
    text = "\n".join(
        f'vllm:spec_decode_{n}_total{{engine="{e}",model_name="m"}} {v}'
        for e in (0, 1)
        for n, v in (("num_drafts", 10), ("num_draft_tokens", 40), ("num_accepted_tokens", 7))
    ) + '\nvllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2\n'
    c = counters_from_text(text)
    assert (c.drafts, c.draft_tokens, c.accepted, c.per_pos) == (20.0, 80.0, 14.0, (0.0, 2.0))
    assert c - SpecCounters(5, 20, 4, (1.0,)) == SpecCounters(15, 60, 10, (-1.0, 2.0))


def test_renewal_standard_errors_match_a_bootstrap_over_prompts_and_survive_shards() -> None:
    rng = np.random.default_rng(1)
    parts = [_acc(seed=s, prompts=1) for s in range(40)]
    whole = Accumulator(k_max=4, drafting="greedy")
    for p in parts:
        whole.merge(Accumulator.from_state(p.to_state()))  # what shards do
    se, pos_se = whole.renewal_se()
    a = np.array([p.renewal_accepted.sum(1) for p in parts])
    d = np.array([p.renewal_drafted.sum(1) for p in parts])
    boot = [a[ix].sum(0) / d[ix].sum(0) for ix in (rng.integers(0, 40, 40) for _ in range(3000))]
    assert se == pytest.approx(np.std(boot, axis=0), rel=0.15)  # the linearised SE is the bootstrap's, to its own noise
    for i in (0, 3):  # per position at K = 4: rounds accepting 1..i ÷ rounds drafting depth i
        acc_i = np.array([p.renewal_accepted[3, i] for p in parts])
        drafts_i = np.array([p.renewal_drafted[3, i] for p in parts])
        boot_i = [acc_i[ix].sum() / drafts_i[ix].sum() for ix in (rng.integers(0, 40, 40) for _ in range(3000))]
        assert pos_se[3, i] == pytest.approx(np.std(boot_i), rel=0.15)
        assert whole.renewal_per_position(4)[1][i] == pos_se[3, i]
    assert np.isnan(_acc(prompts=1).renewal_se()[0]).all()  # one prompt: no spread to read


def test_compare_sets_the_server_beside_the_prediction_at_its_k() -> None:
    acc = _acc()
    # 3 requests, K = 2 (8 draft tokens per 4 drafts)
    run = _run([(4, 8, 3, (2.0, 1.0)), (5, 10, 2, (2.0, 0.0)), (4, 8, 5, (3.0, 2.0))])
    section, metrics, evidence = live.compare(run, acc, Sampling(0.0))
    predicted = acc.renewal_accepted[1].sum() / acc.renewal_drafted[1].sum()
    assert section["k"] == 2 and section["accept_rate"] == pytest.approx(10 / 26)
    assert section["predicted_accept_rate"] == pytest.approx(predicted)
    assert section["per_position"] == pytest.approx([7 / 13, 3 / 13])
    r = 10 / 26
    resid = sum((x - r * y) ** 2 for x, y in ((3, 8), (2, 10), (5, 8)))
    assert section["accept_rate_se"] == pytest.approx(math.sqrt(3 / 2 * resid) / 26)
    both = math.hypot(section["accept_rate_se"], section["predicted_accept_rate_se"])
    assert metrics["live_gap_z"] == pytest.approx((r - predicted) / both)
    assert metrics["live_gap_rel"] == pytest.approx(r / predicted - 1)
    assert metrics["live_known_issue"] == 0  # greedy: the CPU expand bug needs T > 0
    assert "served 0.3846" in evidence["live_accept_rate"][0]


def test_compare_refuses_what_it_cannot_compare() -> None:
    acc = _acc(k_max=2)
    with pytest.raises(ConfigError, match="drafts K = 4 but this run estimated up to K = 2"):
        live.compare(_run([(2, 8, 1, (1.0,))]), acc, Sampling(0.0))
    with pytest.raises(ConfigError, match="drafted nothing"):
        live.compare(_run([(0, 0, 0, ())]), acc, Sampling(0.0))


def test_the_cpu_expand_bug_is_named_at_t_above_zero_on_its_release() -> None:
    assert CPU_EXPAND_KERNEL in get("vllm").known_bugs
    assert CPU_EXPAND_KERNEL.may_affect("0.32.0", 0.7) and CPU_EXPAND_KERNEL.may_affect("0.32.0+cpu", 0.7)
    assert not CPU_EXPAND_KERNEL.may_affect("0.32.0", 0.0) and not CPU_EXPAND_KERNEL.may_affect("0.33.0", 0.7) and not CPU_EXPAND_KERNEL.may_affect(None, 0.7)
    _, metrics, evidence = live.compare(_run([(4, 16, 0, (0.0,) * 4), (4, 16, 0, (0.0,) * 4)]), _acc(), Sampling(0.7))
    assert metrics["live_known_issue"] == 1 and "cpu-expand-kernel" in evidence["live_known_issue"][0]


def test_the_rules_fire_far_below_the_band_only() -> None:
    table = load_table()
    acc = _acc(prompts=40)
    predicted = acc.renewal_accepted[3].sum() / acc.renewal_drafted[3].sum()
    collapsed = _run([(8, 32, 0, (0.0,) * 4)] * 12)  # the server accepts nothing
    _, metrics, evidence = live.compare(collapsed, acc, Sampling(0.7))
    fired = {f.rule_id for f in table.evaluate(metrics, families=["serving"], evidence=evidence)[0]}
    assert fired == {"SP701", "SP703"}
    near = round(predicted * 32)  # the server accepts what the pair predicts
    same = _run([(8, 32, near, (float(near),) + (0.0,) * 3)] * 12, version="0.33.0")
    _, metrics, _ = live.compare(same, acc, Sampling(0.7))
    assert {f.rule_id for f in table.evaluate(metrics, families=["serving"])[0]} == set()


# ----------------------------------------------------------------------------- the client against a stand-in
def _responses_with_counters() -> list[dict[str, Any]]:
    """The completions of tests/data/monitor/requests_vllm.jsonl that carry their own
    counters: `metrics.speculative_decoding` (dense histograms, some `detailed`) and the
    earlier builds' per-choice `speculative_decoding_stats` (sparse histograms)."""
    out = []
    for line in (Path(__file__).parent / "data" / "monitor" / "requests_vllm.jsonl").read_text().splitlines():
        r = json.loads(line)["response"]
        r = json.loads(r) if isinstance(r, str) else r
        if (r.get("metrics") or {}).get("speculative_decoding") or (r["choices"] and r["choices"][0].get("speculative_decoding_stats")):
            out.append(r)
    return out


RESPONSES = _responses_with_counters()


def _own(r: dict[str, Any]) -> tuple[float, float, float, tuple[float, ...]]:
    """(steps, drafted, accepted, accepted per position) as the answer states them, by hand:
    position i accepted in every step that accepted more than i."""
    sd = (r.get("metrics") or {}).get("speculative_decoding") or r["choices"][0]["speculative_decoding_stats"]
    hist = sd["acceptance_histogram"]
    dense = hist if isinstance(hist, list) else [hist.get(str(j), 0) for j in range(sd["num_spec_tokens"] + 1)]
    per_pos = tuple(float(sum(dense[i + 1 :])) for i in range(sd["num_spec_tokens"]))
    return float(sd["num_spec_steps"]), float(sd["num_draft_tokens"]), float(sd["num_accepted_draft_tokens"]), per_pos


class _Stub(BaseHTTPRequestHandler):
    models: list[str] = ["target"]
    metrics = (DATA / "metrics-0.32.0-cpu.txt").read_text()
    fail_after: int | None = None
    served = 0
    own: list[dict[str, Any]] | None = None  # answer prompt [i, …] with own[i]'s body
    bare_from: int | None = None  # from this prompt on, answers without counters
    lock = threading.Condition()
    live = most = 0

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": m} for m in type(self).models]}))
        elif self.path == "/version":
            self._send(200, json.dumps({"version": "0.32.0"}))
        elif self.path == "/metrics":
            self._send(200, type(self).metrics, "text/plain")
        else:
            self._send(404, json.dumps({"detail": "Not Found"}))

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        if cls.fail_after is not None and cls.served >= cls.fail_after:
            self._send(500, json.dumps({"error": {"message": "EngineCore died"}}))
            return
        cls.served += 1
        assert isinstance(body["prompt"], list) and body["top_k"] == -1  # token ids; top-k off
        with cls.lock:
            cls.live += 1
            cls.most = max(cls.most, cls.live)
            cls.lock.notify_all()
            if cls.own is not None and body["prompt"][0] == 1:  # the first sent with others: wait (bounded) to see one
                cls.lock.wait_for(lambda: cls.live > 1, timeout=10)
        time.sleep(0.05 * (1 + body["prompt"][0] % 3))  # later prompts may finish first
        with cls.lock:
            cls.live -= 1
        if cls.own is None or (cls.bare_from is not None and body["prompt"][0] >= cls.bare_from):
            self._send(200, json.dumps({"choices": [{"token_ids": [1, 2, 3]}]}))
            return
        answer = dict(cls.own[body["prompt"][0]])
        answer["choices"] = [{**answer["choices"][0], "token_ids": [1, 2, 3]}]
        self._send(200, json.dumps(answer))


@pytest.fixture()
def stub() -> Iterator[str]:
    _Stub.models, _Stub.fail_after, _Stub.served = ["target"], None, 0
    _Stub.own, _Stub.bare_from, _Stub.live, _Stub.most = None, None, 0, 0
    yield from loopback_stub(_Stub)


def test_the_client_says_what_is_wrong_in_one_line(stub: str) -> None:
    server = live.connect("vllm", stub, None)
    assert (server.model, server.version) == ("target", "0.32.0")
    with pytest.raises(ConfigError, match="does not serve .other."):
        live.connect("vllm", stub, "other")
    _Stub.models = ["a", "b"]
    with pytest.raises(ConfigError, match="serves 2 models"):
        live.connect("vllm", stub, None)
    _Stub.models, _Stub.metrics = ["target"], "# no speculative decoding here\n"
    try:
        with pytest.raises(ConfigError, match="reports no speculative decoding"):
            live.connect("vllm", stub, None)
    finally:
        _Stub.metrics = (DATA / "metrics-0.32.0-cpu.txt").read_text()
    for typo in ("localhost:8000", "http://[bad", "http://127.0.0.1:port"):  # refused at once, no retries
        with pytest.raises(ConfigError, match="is not a URL vLLM can be reached at"):
            live.connect("vllm", typo, None)
    with pytest.raises(ServerError, match="did not answer"):
        live.connect("vllm", "http://127.0.0.1:9", None)  # nothing listens on the discard port
    # --against SGLang: its /metrics has gauges, not the cumulative counters the check needs
    with pytest.raises(ConfigError, match="SGLang's /metrics at .* has no cumulative accepted-token counter"):
        live.connect("sglang", stub, None)


def test_a_server_that_fails_part_way_keeps_what_it_answered(stub: str) -> None:
    server = live.connect("vllm", stub, None)
    _Stub.fail_after = 2
    run = live.send(server, [[1, 2], [3, 4], [5, 6], [7, 8]], Sampling(0.0), 4, 0, 60.0, Progress())
    assert len(run.requests) == 2 and run.stopped is not None and "failed after 2 of 4" in run.stopped and "EngineCore died" in run.stopped
    _Stub.fail_after, _Stub.served = 0, 0
    with pytest.raises(ServerError, match="HTTP 500"):  # nothing answered: nothing to keep
        live.send(server, [[1, 2]], Sampling(0.0), 4, 0, 60.0, Progress())
    _Stub.fail_after = None
    run = live.send(server, [[1, 2]] * 3, Sampling(0.0), 4, 0, 0.0, Progress())  # no time at all
    assert run.requests == [] and run.stopped is not None and "deadline" in run.stopped


def test_answers_that_count_themselves_go_several_at_a_time(stub: str) -> None:
    """A server whose answers carry their own counters (vLLM's
    --per-request-spec-decode-metrics, both shapes): the first prompt goes alone, the rest
    up to IN_FLIGHT at once; each request is what its answer says (its /metrics, which
    never moves here, says nothing), kept in prompt order."""
    server = live.connect("vllm", stub, None)
    _Stub.own = RESPONSES
    n = len(RESPONSES)
    run = live.send(server, [[i, 7] for i in range(n)], Sampling(0.7), 4, 0, 60.0, Progress())
    assert run.stopped is None and (run.counted_by, run.in_flight) == ("response", live.IN_FLIGHT)
    assert [(r.drafts, r.draft_tokens, r.accepted, r.per_pos) for r in run.requests] == [_own(r) for r in RESPONSES]
    assert 1 < _Stub.most <= live.IN_FLIGHT
    assert any("speculative_decoding_stats" in r["choices"][0] for r in RESPONSES)  # the earlier shape is among them
    section, _, evidence = live.compare(run, _acc(k_max=4), Sampling(0.7))
    assert (section["counted_by"], section["in_flight"]) == ("response", live.IN_FLIGHT)
    assert section["draft_tokens"] == sum(_own(r)[1] for r in RESPONSES)
    assert f"({live.IN_FLIGHT} at a time after the first, each counted by its own answer)" in evidence["live_accept_rate"][1]


def test_a_server_without_per_request_counters_is_sent_one_at_a_time(stub: str) -> None:
    server = live.connect("vllm", stub, None)
    run = live.send(server, [[i, 7] for i in range(5)], Sampling(0.0), 4, 0, 60.0, Progress())
    assert (run.counted_by, run.in_flight, len(run.requests)) == ("totals", 1, 5)
    assert _Stub.most == 1  # never two at once: each is the totals' delta across it


def test_answers_that_stop_counting_themselves_keep_what_was_counted(stub: str) -> None:
    """Counters in the first answers and not in a later one (two servers behind one URL):
    the run keeps the requests it could count and says why it stopped."""
    server = live.connect("vllm", stub, None)
    _Stub.own, _Stub.bare_from = RESPONSES, 6
    run = live.send(server, [[i, 7] for i in range(10)], Sampling(0.7), 4, 0, 60.0, Progress())
    assert len(run.requests) == 6 and run.stopped is not None
    assert "failed after 6 of 10 prompts" in run.stopped and "answered prompt 7 without its own counters" in run.stopped
    assert [r.draft_tokens for r in run.requests] == [_own(r)[1] for r in RESPONSES[:6]]


def test_monitor_reads_the_captured_vllm_text_too() -> None:
    """The same captured /metrics through monitor's own parser: vLLM V1's family found,
    nothing it needs missing, and the counters it sums equal the live client's. Bump the
    capture (tests/test_vllm.py writes a fresh one into its tmp folder) when vLLM changes."""
    from specprobe.monitor.exposition import detect_engine, missing_families, parse_exposition

    text = (DATA / "metrics-0.32.0-cpu.txt").read_text()
    samples, malformed = parse_exposition(text)
    names = {s.name.removesuffix("_total") for s in samples if not s.name.endswith("_created")}
    assert malformed == 0 and detect_engine(names) == "vllm-v1"
    assert missing_families("vllm-v1", names, "vllm") == []
    drafted = sum(s.value for s in samples if s.name == "vllm:spec_decode_num_draft_tokens_total")
    assert drafted == counters_from_text(text).draft_tokens == 92.0


class _CutOff(BaseHTTPRequestHandler):
    """Answers every request with a Content-Length it never sends in full, then hangs up:
    a server that dies while writing its answer (vLLM killed mid-response did this)."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "122451")
        self.end_headers()
        self.wfile.write(b'{"choices": [')
        self.wfile.flush()
        self.close_connection = True


def test_an_answer_cut_off_part_way_is_a_server_that_did_not_answer() -> None:
    """http.client's IncompleteRead is no OSError: it once escaped `diagnose --target-server`
    as a traceback. It is retried like a dropped connection, then one line."""
    from specprobe.engines.http import request

    with contextmanager(loopback_stub)(_CutOff) as base, pytest.raises(ServerError, match=r"did not answer \(its answer was cut off: IncompleteRead\)"):
        request(base + "/v1/completions", {"prompt": [1, 2]}, retries=1, what="vLLM")
