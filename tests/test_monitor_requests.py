"""`monitor --requests`: per-request records as vLLM (metrics.speculative_decoding, both
shapes), SGLang (meta_info, three generations of names) and llama.cpp's server
(timings.draft_n*) write them, found anywhere in a gateway's JSON line; per group,
exactly from the records' counters; token windows; per-group thresholds; follow and
rotation. Fixtures in tests/data/monitor/requests_*.jsonl."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.judge.rules import load_table
from specprobe.monitor.grouprules import read_overrides, table_for
from specprobe.monitor.records import MalformedLine
from specprobe.monitor.requests import ALL, RequestSource, group_value, parse_request_line
from specprobe.monitor.runner import Monitor

DATA = Path(__file__).parent / "data" / "monitor"
ROOT = Path(__file__).resolve().parent.parent


def _lines(name: str) -> list[dict]:
    return [json.loads(x) for x in (DATA / name).read_text().splitlines() if x.strip()]


def _body(line: dict) -> dict:
    r = line["response"]
    return json.loads(r) if isinstance(r, str) else r


def _vllm_stats(line: dict) -> dict | None:
    """The engine's own object, read the obvious way (not through the parser)."""
    body = _body(line)
    sd = (body.get("metrics") or {}).get("speculative_decoding")
    if sd is None and body.get("choices"):
        sd = body["choices"][0].get("speculative_decoding_stats")
    return sd


def _run(path: Path, *, group_by: str | None = "task", window: float = 3600, baseline: float = 3600, k: int | None = None, **kw):
    src = RequestSource(str(path), group_by=group_by, num_spec_tokens=k)
    warnings: list[str] = []
    mon = Monitor([src], load_table(kw.pop("rules", [])), window=window, baseline=baseline, interval=1, warn=warnings.append, **kw)
    mon.poll(time.time())
    snap = mon.evaluate(time.time(), anchor_to_data=True)
    src.close()
    return snap, {m.model: m for m in snap.models}, warnings


def test_vllm_records_per_task_exact_to_the_token():
    lines = _lines("requests_vllm.jsonl")
    snap, views, warnings = _run(DATA / "requests_vllm.jsonl")
    assert not warnings
    want: dict[str, list[int]] = {}
    for line in lines:
        sd = _vllm_stats(line)
        if sd is None:
            continue  # drafted nothing / n > 1: no record
        for label in (ALL, f"task={line['task']}"):
            acc = want.setdefault(label, [0, 0, 0, 0])
            acc[0] += sd["num_accepted_draft_tokens"]
            acc[1] += sd["num_draft_tokens"]
            acc[2] += sd["num_spec_steps"]
            acc[3] += 1
    assert set(views) == set(want) == {ALL, "task=code", "task=chat", "task=math"}
    for label, (accepted, drafted, steps, n) in want.items():
        v = views[label]
        assert (v.now.accepted, v.now.draft_tokens, v.now.drafts) == (accepted, drafted, steps), label
        assert v.now.accept_rate == accepted / drafted
        assert v.now.mean_accept_len == 1 + accepted / steps
        assert v.requests is not None and v.requests.requests == n
    # the record on a choice (the earlier build, sparse histogram) and the body logged as text are both read
    assert any(isinstance(x["response"], str) for x in lines)
    assert any("speculative_decoding_stats" in json.dumps(x) for x in lines)


def test_vllm_per_position_from_histogram_equals_per_step_arrays():
    detailed = [x for x in _lines("requests_vllm.jsonl") if "per_step_accepted" in json.dumps(x)]
    assert detailed
    for line in detailed:
        sd = _vllm_stats(line)
        text = json.dumps(line)
        rec = parse_request_line(text)
        assert rec is not None
        by_steps = tuple(sum(1 for a in sd["per_step_accepted"] if a > i) for i in range(sd["num_spec_tokens"]))
        assert rec.accepted_per_pos == by_steps
        del sd["per_step_accepted"], sd["per_step_drafted"]
        body = _body(line)
        body["metrics"]["speculative_decoding"] = sd
        line["response"] = body
        assert parse_request_line(json.dumps(line)).accepted_per_pos == by_steps
        # the cumulative rate at depth 1 is the share of steps that accepted anything
        assert by_steps[0] == sd["num_spec_steps"] - sd["acceptance_histogram"][0]


def test_request_weighted_against_token_weighted_and_share_under_threshold():
    lines = _lines("requests_vllm.jsonl")
    _, views, _ = _run(DATA / "requests_vllm.jsonl")
    chat = [sd for x in lines if x["task"] == "chat" and (sd := _vllm_stats(x))]
    rates = sorted(sd["num_accepted_draft_tokens"] / sd["num_draft_tokens"] for sd in chat)
    r = views["task=chat"].requests
    assert r.rate_mean == pytest.approx(sum(rates) / len(rates), abs=1e-12)
    assert r.below == sum(1 for x in rates if x < 0.5) and r.below_share == r.below / len(rates)
    assert r.quantiles[2] == pytest.approx(rates[len(rates) // 2] if len(rates) % 2 else (rates[len(rates) // 2 - 1] + rates[len(rates) // 2]) / 2)
    # long requests weigh more in the token-weighted figure: the two differ on this data
    assert views["task=chat"].now.accept_rate != pytest.approx(r.rate_mean, abs=1e-6)


def test_group_by_a_dotted_path():
    _, views, _ = _run(DATA / "requests_vllm.jsonl", group_by="metadata.tenant")
    assert set(views) == {ALL, "metadata.tenant=acme", "metadata.tenant=globex"}
    total = sum(views[k].now.accepted for k in views if k != ALL)
    assert total == views[ALL].now.accepted
    assert group_value({"a": {"b": 3}}, "a.b") == "3" and group_value({}, "a.b") == "(none)"


def test_sglang_three_generations_of_meta_info():
    lines = _lines("requests_sglang.jsonl")
    # without K the oldest records (verify count only) have no drafted count: acceptance needs K
    snap, views, _ = _run(DATA / "requests_sglang.jsonl", k=3)
    accepted = drafted = steps = 0
    for x in lines:
        m = x["response"]["meta_info"]
        a = m.get("spec_num_correct_drafts", m.get("spec_accept_token_num", m["completion_tokens"] - m["spec_verify_ct"]))
        accepted += a
        drafted += m.get("spec_num_proposed_drafts", m.get("spec_draft_token_num", m["spec_verify_ct"] * 3))
        steps += m["spec_verify_ct"]
        # SGLang's own accept length: completion tokens per verify step, bonus included
        if "spec_accept_length" in m:
            assert m["spec_accept_length"] == pytest.approx(1 + a / m["spec_verify_ct"])
    v = views[ALL]
    assert (v.now.accepted, v.now.draft_tokens, v.now.drafts) == (accepted, drafted, steps)
    oldest = next(x for x in lines if "spec_accept_rate" not in x["response"]["meta_info"])
    rec = parse_request_line(json.dumps(oldest))
    assert rec is not None and rec.drafted is None and not math.isnan(rec.mean_len)
    newest = next(x for x in lines if "spec_correct_drafts_histogram" in x["response"]["meta_info"])
    rec = parse_request_line(json.dumps(newest))
    hist = newest["response"]["meta_info"]["spec_correct_drafts_histogram"]
    assert rec.accepted_per_pos[0] == sum(hist[1:]) and sum(rec.accepted_per_pos) == rec.accepted


def test_llamacpp_timings_records():
    lines = _lines("requests_llamacpp.jsonl")
    _, views, _ = _run(DATA / "requests_llamacpp.jsonl")
    for task in ("code", "chat", "math"):
        rows = [x["response"]["timings"] for x in lines if x["task"] == task]
        v = views[f"task={task}"]
        assert (v.now.accepted, v.now.draft_tokens) == (sum(t["draft_n_accepted"] for t in rows), sum(t["draft_n"] for t in rows))
        assert math.isnan(v.now.mean_accept_len)  # the server reports no verify steps
    # epoch milliseconds in `timestamp`
    assert parse_request_line(json.dumps(lines[1])).t == lines[1]["timestamp"] / 1000


def test_malformed_and_unrelated_lines(tmp_path: Path):
    good = (DATA / "requests_llamacpp.jsonl").read_text().splitlines()[0]
    bad_counts = json.dumps({"task": "x", "timings": {"draft_n": 3, "draft_n_accepted": 5}})
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join([good, "not json {", bad_counts, json.dumps({"task": "x", "msg": "no drafting"}), ""]) + "\n")
    snap, views, warnings = _run(f)
    assert snap.sources[0].malformed == 2
    assert len(warnings) == 1 and "malformed line 2" in warnings[0]
    assert views[ALL].requests.requests == 1
    with pytest.raises(MalformedLine):
        parse_request_line(json.dumps({"metrics": {"speculative_decoding": {"num_accepted_draft_tokens": 5, "num_spec_steps": 2, "num_draft_tokens": 6, "acceptance_histogram": [0, 2]}}}))
    assert parse_request_line(json.dumps({"metrics": {"speculative_decoding": None}})) is None


def test_token_window_takes_the_newest_whole_requests():
    lines = [x for x in _lines("requests_vllm.jsonl") if _vllm_stats(x)]
    _, views, _ = _run(DATA / "requests_vllm.jsonl", group_by=None, window_tokens=100, baseline_tokens=300)
    got, n = 0, 0
    for x in reversed(lines):
        if got >= 100:
            break
        got += _vllm_stats(x)["num_draft_tokens"]
        n += 1
    v = views[ALL]
    assert v.now.draft_tokens == got and v.requests.requests == n
    assert v.base.draft_tokens >= 300


def test_per_group_thresholds_from_a_rules_file(tmp_path: Path):
    rules = tmp_path / "groups.yaml"
    rules.write_text("version: 1\nrules: []\ngroups:\n  code: {SP408: 0.6}\n")
    files = [ROOT / "rules" / "monitor-mtp.yaml", rules]
    table = load_table(files)
    over = read_overrides(files, table)
    assert "0.6" in table_for(table, over, "task=code").get("SP408").when
    assert table_for(table, over, "task=chat").get("SP408").when == table.get("SP408").when
    _, views, _ = _run(DATA / "requests_vllm.jsonl", rules=files, group_overrides=over)
    ids = {k: {f.rule_id for f in v.findings} for k, v in views.items()}
    _, plain, _ = _run(DATA / "requests_vllm.jsonl", rules=files)
    code_rate = views["task=code"].now.accept_rate
    assert 0.6 <= code_rate < 0.7, code_rate  # the fixture's code traffic sits between the two floors
    assert "SP408" not in ids["task=code"]  # its own floor (60 %)
    assert "SP408" in {f.rule_id for f in plain["task=code"].findings}  # the shipped one (70 %)
    assert "SP408" in ids["task=math"] and "SP408" not in ids[ALL]  # the per-group rule never fires on all
    assert "SP407" in ids[ALL]  # MTP: under 80 % over all traffic


def test_cli_per_task_alert_exit_codes_and_json(tmp_path: Path):
    out = tmp_path / "w.json"
    r = CliRunner().invoke(app, ["monitor", "--requests", str(DATA / "requests_vllm.jsonl"), "--group-by", "task", "--rules", str(ROOT / "rules" / "monitor-mtp.yaml"),
                                 "--window", "1h", "--json", str(out), "--no-live"])
    assert r.exit_code == 1, r.output
    doc = json.loads(out.read_text())
    rows = {m["model"]: m for m in doc["models"]}
    assert "SP408" in rows["task=math"]["findings"] and rows["task=math"]["requests"]["requests"] == 8
    alerts = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert {(a["model"], a["rule_id"]) for a in alerts} >= {("task=math", "SP408"), ("all", "SP407")}


@pytest.mark.parametrize(("args", "needle"), [
    (["--group-by", "task", "--log", "x.log"], "--group-by needs --requests"),
    (["--requests", "REQ", "--window", "100tok", "--baseline-window", "1h"], "is a duration but --window"),
    (["--url", "http://127.0.0.1:9/metrics", "--window", "100tok"], "counts tokens"),
    (["--requests", "missing.jsonl"], "requests file missing.jsonl does not exist"),
    (["--requests", "REQ", "--group-by", "a..b"], "is not a field path"),
    (["--requests", "REQ", "--window", "0tok"], "at least one token"),
])
def test_cli_refuses_bad_input(args: list[str], needle: str):
    args = [str(DATA / "requests_vllm.jsonl") if a == "REQ" else a for a in args]
    r = CliRunner().invoke(app, ["monitor", *args, "--once", "--no-live"])
    assert r.exit_code == 2 and needle in r.output, r.output


def test_follow_across_rotation(tmp_path: Path):
    lines = (DATA / "requests_llamacpp.jsonl").read_text().splitlines(keepends=True)
    path = tmp_path / "gw.jsonl"
    path.write_text("".join(lines[:3]))
    src = RequestSource(str(path), follow=True, group_by="task")
    mon = Monitor([src], load_table(), window=3600, baseline=3600, interval=1)
    try:
        def wait_for(n: int) -> None:
            for _ in range(100):
                mon.poll(time.time())
                if src.records >= n:
                    return
                time.sleep(0.05)
            raise AssertionError(f"{src.records} records read, wanted {n}")

        wait_for(3)
        with path.open("a") as fh:
            fh.write(lines[3])
        wait_for(4)
        os.rename(path, tmp_path / "gw.jsonl.1")  # logrotate: renamed away, a new file created
        path.write_text("".join(lines[4:]))
        wait_for(len(lines))
    finally:
        src.close()
    want = sum(json.loads(x)["response"]["timings"]["draft_n_accepted"] for x in lines)
    assert sum(v for _, v in mon.store[ALL].events["accepted_tokens"]) == want


def test_tensorrt_llm_iteration_stats():
    raw = [json.loads(x) for x in (DATA / "requests_trtllm.jsonl").read_text().splitlines()]
    iterations = [y for x in raw for y in (x if isinstance(x, list) else [x])]
    spec = [it["specDecodingStats"] for it in iterations if it["specDecodingStats"]["numDraftTokens"]]
    _, views, warnings = _run(DATA / "requests_trtllm.jsonl", group_by=None)
    v = views[ALL]
    assert not warnings
    accepted, drafted, steps = (sum(s[k] for s in spec) for k in ("numAcceptedTokens", "numDraftTokens", "numRequestsWithDraftTokens"))
    assert (v.now.accepted, v.now.draft_tokens, v.now.drafts) == (accepted, drafted, steps)
    # TensorRT-LLM's own acceptanceLength is 1 + accepted ÷ requests with drafts, per iteration
    for s in spec:
        assert s["acceptanceLength"] == pytest.approx(1 + s["numAcceptedTokens"] / s["numRequestsWithDraftTokens"])
    assert v.requests.requests == 9  # 8 iterations a line, and one /metrics poll of 4 iterations


def test_the_once_view_fits_80_columns_with_groups_and_drift(tmp_path: Path):
    r = CliRunner().invoke(app, ["monitor", "--requests", str(DATA / "requests_vllm.jsonl"), "--group-by", "task", "--window", "100tok", "--no-live", "--fail-on", "never"],
                           env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    text = r.stderr if hasattr(r, "stderr") and r.stderr else r.output
    view = [x for x in text.splitlines() if not x.startswith("{")]
    assert max(len(x) for x in view) <= 80
    assert "per-request acceptance in the current window" in text and "task=math" in text
    assert "window 100 tokens, baseline 1000 tokens before it" in text.replace("\n", " ")
    assert "drift: trend" in text  # 24 records in 100-token windows: enough windows to test


def test_sglang_request_that_never_verified_is_no_record():
    line = {"task": "x", "meta_info": {"spec_verify_ct": 0, "completion_tokens": 1, "prompt_tokens": 9}}
    assert parse_request_line(json.dumps(line)) is None
    line["meta_info"].update(spec_verify_ct=4, completion_tokens=11)
    rec = parse_request_line(json.dumps(line), num_spec_tokens=3)
    assert (rec.accepted, rec.drafted, rec.steps) == (7, 12, 4)  # SGLang's accept length 11 / 4 = 1 + 7 / 4
