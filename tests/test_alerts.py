"""`specprobe alerts`: the generated Prometheus rules pass `promtool check rules` for every
engine, translate the table's thresholds, and — in a real Prometheus scraping a loopback
exporter whose acceptance drops — fire the acceptance alert (read from /api/v1/alerts).
Skips cleanly when promtool / prometheus are not installed."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.judge.conditions import parse_condition
from specprobe.judge.rules import load_table
from specprobe.monitor.promrules import Windows, rules_document, to_promql

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("vllm", "sglang", "llama.cpp")


def _gen(tmp_path: Path, engine: str, *extra: str) -> Path:
    out = tmp_path / f"rules-{engine}.yml"
    r = CliRunner().invoke(app, ["alerts", "--engine", engine, "--prometheus", str(out), "--grafana", str(tmp_path / f"dash-{engine}.json"), *extra])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_generated_rules_pass_promtool(tmp_path: Path, engine: str):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    for extra in ((), ("--rules", str(ROOT / "rules" / "monitor-mtp.yaml"), "--window", "30s", "--for", "0s", "--evaluation-interval", "15s")):
        path = _gen(tmp_path, engine, *extra)
        res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "SUCCESS" in res.stdout


@pytest.mark.parametrize("engine", ENGINES)
def test_rules_carry_the_tables_thresholds_in_the_engines_names(tmp_path: Path, engine: str):
    doc = yaml.safe_load(_gen(tmp_path, engine, "--rules", str(ROOT / "rules" / "monitor-mtp.yaml")).read_text())
    recording, alerting = doc["groups"][0]["rules"], doc["groups"][1]["rules"]
    exprs = " ".join(r["expr"] for r in recording)
    prefix = {"vllm": "vllm:spec_decode_num_accepted_tokens_total", "sglang": "sglang:spec_accept_length", "llama.cpp": "llamacpp:spec_decode_num_accepted_tokens_total"}[engine]
    assert prefix in exprs
    by_id = {a["labels"]["rule_id"]: a for a in alerting}
    assert by_id["SP402"]["expr"] == "(specprobe:spec_decode_acceptance_rate:5m >= 0.05) and (specprobe:spec_decode_acceptance_rate:5m < 0.5)"
    assert by_id["SP407"]["expr"] == "specprobe:spec_decode_acceptance_rate:5m < 0.8"
    assert by_id["SP403"]["expr"] == "specprobe:spec_decode_acceptance_drop:5m > 0.2"
    assert "SP408" not in by_id  # per-group: only per-request records have groups
    assert ("SP404" in by_id) == (engine != "sglang")  # SGLang exposes no per-position series
    if engine == "vllm":
        assert any("engine" in r["record"] for r in recording)
    dash = json.loads((tmp_path / f"dash-{engine}.json").read_text())
    assert all(t["expr"].startswith("specprobe:") for p in dash["panels"] for t in p["targets"])
    floors = [s["value"] for s in dash["panels"][0]["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None]
    assert floors == [0.05, 0.5, 0.8]


def test_a_rule_override_changes_the_generated_threshold(tmp_path: Path):
    extra = tmp_path / "mine.yaml"
    extra.write_text("rules:\n  - {id: SP402, family: monitoring, name: monitor-acceptance-low, severity: warning, when: 'monitor_accept_rate < 0.6', diagnosis: d, remedy: r}\n")
    doc, _ = rules_document(load_table([extra]), "vllm", Windows())
    (sp402,) = [a for a in doc["groups"][1]["rules"] if a["labels"]["rule_id"] == "SP402"]
    assert sp402["expr"] == "specprobe:spec_decode_acceptance_rate:5m < 0.6"
    assert to_promql(parse_condition("0.3 < monitor_accept_rate"), {"monitor_accept_rate": "x"}) == "x > 0.3"


def test_cli_refuses_bad_input(tmp_path: Path):
    r = CliRunner().invoke(app, ["alerts", "--engine", "tgi", "--prometheus", str(tmp_path / "x.yml")])
    assert r.exit_code == 2 and "--engine 'tgi' is not one of" in r.output
    r = CliRunner().invoke(app, ["alerts", "--engine", "vllm"])
    assert r.exit_code == 2 and "nothing to write" in r.output
    assert not (tmp_path / "x.yml").exists()


# ----------------------------------------------------------------------------- a real Prometheus
class _Exporter:
    """vLLM V1 counters for one model, advanced every 0.25 s at the acceptance set."""

    def __init__(self) -> None:
        self.accept = 0.8
        self.c = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos": [0, 0, 0]}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        while not self.stop.wait(0.25):
            with self.lock:
                # 20 drafts of K = 3; acceptance a: accepted tokens 60·a, laid out as a prefix
                a = self.accept
                self.c["drafts"] += 20
                self.c["draft_tokens"] += 60
                self.c["accepted"] += round(60 * a)
                for i in range(3):
                    self.c["pos"][i] += round(20 * a * (1.0 - 0.1 * i))

    def text(self) -> str:
        with self.lock:
            c = dict(self.c, pos=list(self.c["pos"]))
        lab = 'engine="0",model_name="m"'
        lines = [
            "# TYPE vllm:spec_decode_num_drafts counter", f"vllm:spec_decode_num_drafts_total{{{lab}}} {c['drafts']}",
            "# TYPE vllm:spec_decode_num_draft_tokens counter", f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {c['draft_tokens']}",
            "# TYPE vllm:spec_decode_num_accepted_tokens counter", f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {c['accepted']}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
            *[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}' for i, v in enumerate(c["pos"])],
        ]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback only
        return json.loads(r.read())


def _firing(base: str) -> set[tuple[str, str]]:
    doc = _get(f"{base}/api/v1/alerts")
    return {(a["labels"].get("rule_id", ""), a["labels"].get("model_name", "")) for a in doc["data"]["alerts"] if a["state"] == "firing"}


def test_real_prometheus_fires_when_acceptance_drops(tmp_path: Path):
    prom = shutil.which("prometheus")
    if prom is None:
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    rules = _gen(tmp_path, "vllm", "--window", "10s", "--baseline-window", "20s", "--drift-window", "1m", "--for", "0s", "--evaluation-interval", "1s")
    exporter = _Exporter()
    port = _free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}],
    }))
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen([prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        rate_q = f"{base}/api/v1/query?query=specprobe:spec_decode_acceptance_rate:10s"

        def rate() -> float | None:
            res = _get(rate_q)["data"]["result"]
            return float(res[0]["value"][1]) if res else None

        deadline = time.monotonic() + 40
        healthy = None
        while time.monotonic() < deadline:  # the 10 s window fills at 80 %
            try:
                healthy = rate()
            except OSError:
                healthy = None
            if healthy is not None and abs(healthy - 0.8) < 0.02:
                break
            time.sleep(0.5)
        assert healthy is not None and abs(healthy - 0.8) < 0.02, (tmp_path / "prometheus.log").read_text()[-2000:]
        assert ("SP402", "m") not in _firing(base)

        def value(record: str) -> list[float]:
            return [float(r["value"][1]) for r in _get(f"{base}/api/v1/query?query={record}")["data"]["result"]]

        # the other records, evaluated by Prometheus itself: 1 + 3·0.8 tokens a step, per-position
        # rates 0.8 · (1, 0.9, 0.8), deepest ÷ first 0.8, the one engine's series equal to the sum
        assert value("specprobe:spec_decode_mean_acceptance_length:10s") == [pytest.approx(3.4, abs=0.06)]
        assert sorted(value("specprobe:spec_decode_acceptance_rate_per_position:10s")) == pytest.approx([0.64, 0.72, 0.8], abs=0.03)
        assert value("specprobe:spec_decode_depth_decay:10s") == [pytest.approx(0.8, abs=0.02)]
        assert value("specprobe:spec_decode_acceptance_rate_by_engine:10s") == [pytest.approx(healthy, abs=0.02)]
        exporter.accept = 0.2  # the drafter breaks
        seen: set[tuple[str, str]] = set()
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not {("SP402", "m"), ("SP403", "m")} <= seen:
            seen |= _firing(base)
            time.sleep(0.5)
        assert ("SP402", "m") in seen, seen  # acceptance under the 50 % floor
        assert ("SP403", "m") in seen, seen  # and more than 20 % under the baseline before the window
        assert ("SP401", "m") not in seen  # 20 % is low, not collapsed (< 5 %)
        assert rate() == pytest.approx(0.2, abs=0.05)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        exporter.close()


def test_alerts_and_monitor_requests_start_without_torch(tmp_path: Path):
    from tests.helpers import runs_without

    req = str(ROOT / "tests" / "data" / "monitor" / "requests_vllm.jsonl")
    runs_without(
        [["'alerts'", "'--engine'", "'vllm'", "'--prometheus'", repr(str(tmp_path / "r.yml")), "'--grafana'", repr(str(tmp_path / "d.json"))],
         ["'monitor'", "'--requests'", repr(req), "'--group-by'", "'task'", "'--window'", "'100tok'", "'--fail-on'", "'never'", "'--no-live'"]],
        ("transformers", "safetensors", "accelerate"), block_torch=True,  # import torch raises: any use fails the command
    )
