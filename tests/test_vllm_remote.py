"""`diagnose --target-server` against a real vLLM: PyPI's CPU build serving SmolLM2-135M
(fp32, no speculative decoding) as the target, the drafter — the target's first 24
layers written as a checkpoint of their own — loaded here as an independent HF drafter.
One server for the module; 4 prompts × 24 tokens. Skipped when vLLM is not installed
(fails where SPECPROBE_EXPECT_VLLM=1).

At T = 0 every position is exact (rank 1 is always returned): the served scoring must
match the drafter against the target loaded here, position by position, and the local
`diagnose` on the same prompts must reach the same best K and verdict. At T = 1 with
greedy drafting and a small top-n, the bounds must contain the local value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import CrashingProxy
from tests.helpers.vllm import (
    VllmServer,
    smollm2_pair,
    vllm_server,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LAYERS, PROMPTS, MAX_TOKENS, K, MAX_LOGPROBS = 24, 4, 24, 4, 50
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return smollm2_pair(tmp_path_factory.mktemp("vllm-remote"), LAYERS, PROMPTS)


@pytest.fixture(scope="module")
def server(vllm_python: Path, pair: dict[str, Any]) -> Iterator[VllmServer]:
    """The target alone (no speculative decoding), up to MAX_LOGPROBS top logprobs."""
    with vllm_server(vllm_python, pair["target"], None, 0, pair["work"] / "vllm.log", startup_timeout=900, max_logprobs=MAX_LOGPROBS) as s:
        yield s


def _cmd(args: list[str], out: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "specprobe", "diagnose", *args, "--fail-on", "never", "--brief", "--device", "cpu", "--dtype", "float32"]
    return cmd + (["--json", str(out)] if out is not None else [])


def _run(args: list[str], out: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_cmd(args, out), cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)


def _common(pair: dict[str, Any], temperature: str = "0") -> list[str]:
    return ["--prompts", str(pair["prompts"]), "--max-new-tokens", str(MAX_TOKENS), "--temperature", temperature,
            "--k-max", str(K), "--cost-ratio", "0.8", "--verify-factor", "1", "--no-cache"]


@pytest.fixture(scope="module")
def remote(server: VllmServer, pair: dict[str, Any]) -> dict[str, Any]:
    out = pair["work"] / "remote.json"
    proc = _run(["--target-server", server.base, "--target-model", "target", str(pair["draft"]), *_common(pair)], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    result["_stdout"] = proc.stdout
    return result


def _local_values(target: Path, draft: Path, seqs: list[tuple[list[int], list[int]]], temperature: float) -> list[dict[str, np.ndarray]]:
    """The target and drafter loaded here (fp32) over prompt + reference ids: per position
    the metrics `diagnose` computes."""
    import torch

    from specprobe.metrics.core import position_metrics_reference
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.loader import load_model

    t = load_model(str(target), "cpu", "float32")
    d = load_model(str(draft), "cpu", "float32")
    s = Sampling(temperature=temperature)
    out = []
    with torch.inference_mode():
        for enc, cont in seqs:
            x = torch.tensor([enc + cont])
            m = torch.ones_like(x)
            sl = slice(len(enc) - 1, len(enc) - 1 + len(cont))
            tl = t.head(t.last_hidden(x, m)[0, sl]).float()
            dl = d.head(d.last_hidden(x, m)[0, sl]).float()
            pm = position_metrics_reference(tl, dl, s, Sampling(temperature=0.0) if temperature == 0 else s)
            out.append({"accept_prob_greedy_draft": pm.accept_prob_greedy_draft.double().numpy(), "greedy_agree": pm.greedy_agree.double().numpy(),
                        "accept_prob": pm.accept_prob.double().numpy(), "dl": dl, "tl": tl})
    return out


@pytest.fixture(scope="module")
def sampled_t1(server: VllmServer, pair: dict[str, Any]) -> tuple[list[tuple[list[int], list[int]]], list[dict[str, Any]]]:
    """The server's references at T = 1 and the local values over them (two tests read them)."""
    seqs = _references(server, pair, 1.0)
    return seqs, _local_values(pair["target"], pair["draft"], seqs, 1.0)


def _references(server: VllmServer, pair: dict[str, Any], temperature: float) -> list[tuple[list[int], list[int]]]:
    """The run's prompt ids and the server's references at seed 0 + i, as diagnose asks."""
    from specprobe.engines import get
    from specprobe.probe.references import encode_prompt, load_prompt_set
    from specprobe.settings.pipeline import DiagnoseConfig

    live = get("vllm").live_server(server.base, "target")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(pair["target"]))
    prompts = load_prompt_set(DiagnoseConfig(target="", drafter="", prompts=str(pair["prompts"]))).prompts
    seqs = []
    for i, p in enumerate(prompts):
        enc = encode_prompt(tok, p)
        seqs.append((enc, live.complete(enc, MAX_TOKENS, {"temperature": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0}, i, timeout=300)))
    return seqs


def test_greedy_served_scoring_matches_the_local_target(remote: dict[str, Any], server: VllmServer, pair: dict[str, Any]) -> None:
    r = remote["remote"]
    assert r["exact"] and r["exact_positions"] == r["positions"] > 0
    assert r["requests"] == PROMPTS and r["bytes"] > 0
    assert r["accept_low"] == r["accept_high"]
    assert remote["metrics"]["kl_target_draft_nats"] is None  # left out: it needs all of p
    assert "LOW END" not in remote["_stdout"]  # exact: nothing said to be a bound
    seqs = _references(server, pair, 0.0)
    local = _local_values(pair["target"], pair["draft"], seqs, 0.0)
    pos = remote["positions"]
    ids = list(dict.fromkeys(pos["prompt_id"]))
    worst = 0.0
    for pid, (enc, cont), loc in zip(ids, seqs, local, strict=True):
        rows = [i for i, x in enumerate(pos["prompt_id"]) if x == pid]
        got = np.array([pos["accept_prob_greedy_draft"][i] for i in rows])
        assert [pos["position"][i] for i in rows] == list(range(len(enc), len(enc) + len(cont)))
        worst = max(worst, float(np.abs(got - loc["accept_prob_greedy_draft"]).max()))
    (pair["work"] / "agreement.txt").write_text(f"max |served − local| greedy-draft acceptance per position: {worst}\n")
    assert worst <= 1e-3, worst


def test_greedy_served_diagnose_agrees_with_the_local_one(remote: dict[str, Any], pair: dict[str, Any]) -> None:
    out = pair["work"] / "local.json"
    proc = _run([str(pair["target"]), str(pair["draft"]), *_common(pair)], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    local = json.loads(out.read_text())
    assert remote["metrics"]["best_k"] == local["metrics"]["best_k"]
    assert remote["verdict"] == local["verdict"]
    assert remote["metrics"]["accept_prob_engine_mean"] == pytest.approx(local["metrics"]["accept_prob_engine_mean"], abs=0.02)
    for a, b in zip(remote["remote"]["k_table"], local["k_table"], strict=True):
        assert a["tau_low"] == pytest.approx(b["tau_renewal_tokens"], rel=0.05)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_target_bounds_contain_the_local_value(temperature: float, server: VllmServer, pair: dict[str, Any], sampled_t1: Any) -> None:
    """T = 1 and T = 0.7, top-5: where the drafter's argmax is not listed (at 0.7: where
    the unlisted mass leaves the normaliser open), p(argmax q) and α are ranges; every
    range holds the value from the target loaded here at that temperature (vLLM's prompt
    logprobs are the raw T = 1 distribution whatever the request says)."""
    from specprobe.engines import get
    from specprobe.metrics.remote import TopN, bounded_metrics
    from specprobe.metrics.sampling import Sampling

    if temperature == 1.0:
        seqs, local = sampled_t1
    else:
        seqs = _references(server, pair, temperature)
        local = _local_values(pair["target"], pair["draft"], seqs, temperature)
    live = get("vllm").live_server(server.base, "target")
    exact = total = 0
    for (enc, cont), loc in zip(seqs, local, strict=True):
        got = live.prompt_logprobs(enc + cont, 5, timeout=300).rows[len(enc) - 1 : len(enc) - 1 + len(cont)]
        for draft in (Sampling(temperature=0.0), Sampling(temperature=1.0)):
            b = bounded_metrics(TopN.from_rows(got, 5), loc["dl"], Sampling(temperature=temperature), draft)
            truth = _local_values_at(loc, draft, temperature)
            key = "accept_prob_greedy_draft" if draft.greedy else "accept_prob"
            assert np.all(b.low[key] <= truth[key] + 1e-3) and np.all(truth[key] <= b.high[key] + 1e-3), (b.low[key], truth[key], b.high[key])
            if draft.greedy:
                exact += int(b.exact.sum())
                total += len(cont)
                assert np.abs(b.low[key][b.exact] - truth[key][b.exact]).max(initial=0.0) <= 1e-3
    assert 0 <= exact <= total and (exact > 0 or temperature != 1.0)


def _local_values_at(loc: dict[str, Any], draft: Any, temperature: float = 1.0) -> dict[str, np.ndarray]:
    from specprobe.metrics.core import position_metrics_reference
    from specprobe.metrics.sampling import Sampling

    pm = position_metrics_reference(loc["tl"], loc["dl"], Sampling(temperature=temperature), draft)
    return {"accept_prob_greedy_draft": pm.accept_prob_greedy_draft.double().numpy(), "accept_prob": pm.accept_prob.double().numpy()}


@pytest.mark.parametrize("case", ["model", "logprobs", "self_draft", "top_k"])
def test_bad_input_is_one_line_exit_2(case: str, server: VllmServer, pair: dict[str, Any]) -> None:
    args = {
        "model": ["--target-server", server.base, "--target-model", "llama-405b", str(pair["draft"])],
        "logprobs": ["--target-server", server.base, "--target-logprobs", str(MAX_LOGPROBS + 50), str(pair["draft"])],
        "self_draft": ["--target-server", server.base, "self:layers=24"],
        "top_k": ["--target-server", server.base, str(pair["draft"]), "--top-k", "50"],
    }[case]
    proc = _run([*args, *_common(pair, "1" if case == "top_k" else "0")])
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    said = proc.stderr.strip()
    assert "Traceback" not in said
    want = {"model": "does not serve", "logprobs": "--max-logprobs", "self_draft": "checkpoint", "top_k": "top-k"}[case]
    assert want in said, said


def test_a_served_tokenizer_that_does_not_round_trip_is_one_line(server: VllmServer, pair: dict[str, Any]) -> None:
    """TARGET names a tokenizer other than the one the server loaded (the target's
    vocabulary shuffled): the server's /tokenize ids differ, exit 2 before any request
    costs anything."""
    from specprobe.models.loader import load_model
    from specprobe.probe.demo import make_vocab_shuffled

    shuffled = make_vocab_shuffled(load_model(str(pair["target"]), "cpu", "float32"), pair["work"] / "shuffled")
    proc = _run([str(shuffled), str(pair["draft"]), "--target-server", server.base, *_common(pair)])
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    said = " ".join(proc.stderr.split())
    assert "Traceback" not in said and "server's token ids for a probe text differ" in said and "give the served target's own tokenizer" in said, said


RESUME_PROMPTS, RESUME_TOKENS = 8, 16


def test_a_run_the_server_left_continues_where_it_stopped(server: VllmServer, pair: dict[str, Any], tmp_path: Path) -> None:
    """The server crashes once the first prompt's scores are kept: the run ends as an
    interrupted one (exit 130, one error line, the scored prompts written), the cache keeps
    what the server answered; rerun against a live server at another address, it continues
    from there, and its result equals a one-shot run's (T = 0). The crash is a pass-through
    in front of the module's server that stops listening and ends its open connections
    (what a client of a SIGKILLed server meets), so no second vLLM is started for it."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_vllm_peer import pick_prompts

    prompts = pick_prompts(RESUME_PROMPTS, tmp_path / "prompts.jsonl")
    env = {**os.environ, "SPECPROBE_CACHE_DIR": str(tmp_path / "cache")}
    common = ["--prompts", str(prompts), "--max-new-tokens", str(RESUME_TOKENS), "--temperature", "0", "--k-max", str(K),
              "--cost-ratio", "0.8", "--verify-factor", "1"]
    scores = tmp_path / "cache" / "remote"

    def kept() -> int:
        return sum(f.read_text().count("\n") for f in scores.glob("*.scores.jsonl")) if scores.exists() else 0

    cut = tmp_path / "cut.json"
    doomed = CrashingProxy(server.base)
    proc = subprocess.Popen(_cmd(["--target-server", doomed.base, "--target-model", "target", str(pair["draft"]), *common], cut),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 600
        while kept() == 0 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        doomed.crash()
        _, err = proc.communicate(timeout=600)
    finally:
        doomed.crash()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = " ".join(err.split())
    assert "Traceback" not in said and "did not answer" in said and "rerun the same command" in said, said
    first = kept()
    assert 1 <= first < RESUME_PROMPTS, first
    if proc.returncode == 130:  # scored prompts: written as an interrupted run's
        partial = json.loads(cut.read_text())
        assert partial["interrupted"] and 1 <= len(set(partial["positions"]["prompt_id"])) <= first
    else:  # the first prompt's request was among those cut (a later one was kept): nothing scored to write
        assert proc.returncode == 2 and not cut.exists(), (proc.returncode, err[-3000:])

    again = tmp_path / "again.json"
    proc = _run(["--target-server", server.base, "--target-model", "target", str(pair["draft"]), *common], again, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stderr.split())
    assert f"{RESUME_PROMPTS} of {RESUME_PROMPTS} references already written" in said and f"{first} of {RESUME_PROMPTS} prompts already scored" in said, said
    resumed = json.loads(again.read_text())
    assert resumed["remote"]["resumed_prompts"] == first and resumed["remote"]["requests"] == RESUME_PROMPTS - first

    once = tmp_path / "once.json"
    proc = _run(["--target-server", server.base, "--target-model", "target", str(pair["draft"]), *common, "--no-cache"], once)
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = json.loads(once.read_text())
    assert resumed["remote"]["exact"] and whole["remote"]["exact"]
    for key in ("metrics", "k_table", "depth", "positions", "verdict"):
        assert resumed[key] == whole[key], key


def test_widening_tightens_the_loose_positions_and_keeps_the_truth(server: VllmServer, pair: dict[str, Any], sampled_t1: Any) -> None:
    """T = 1, top-2 first, then the prompts with loose positions again with top-50 (the
    server's --max-logprobs), each cut after its last loose position: no range widens,
    every range still holds the local target's value, and some positions become exact."""
    from specprobe.core.progress import Progress
    from specprobe.engines import get
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.loader import load_model
    from specprobe.probe.alignment import SamplingPair
    from specprobe.probe.references import load_prompt_set
    from specprobe.probe.remote_scoring import ServerScoring
    from specprobe.settings.pipeline import DiagnoseConfig

    seqs, local = sampled_t1
    live = get("vllm").live_server(server.base, "target")
    drafter = load_model(str(pair["draft"]), "cpu", "float32")
    prompts = list(load_prompt_set(DiagnoseConfig(target="", drafter="", prompts=str(pair["prompts"]))).prompts)
    sampling = SamplingPair(Sampling(temperature=1.0), Sampling(temperature=1.0))
    runs = {}
    for widen in (0, MAX_LOGPROBS):
        cfg = DiagnoseConfig(target="", drafter=str(pair["draft"]), target_logprobs=2, target_widen=widen, k_max=K, use_cache=False, engine="vllm")
        s = ServerScoring(live, cfg, drafter, sampling, None, Progress(), keep_bounds=True)
        s.run(prompts, [e for e, _ in seqs], [c for _, c in seqs])
        runs[widen] = s
    narrow, wide = runs[0], runs[MAX_LOGPROBS]
    w = wide.extra()["widened"]
    assert w["logprobs"] == MAX_LOGPROBS and w["requests"] == w["prompts"] > 0 and w["bytes"] > 0
    assert 0 < w["made_exact"] <= w["positions"] == narrow.positions - narrow.exact
    assert wide.exact == narrow.exact + w["made_exact"]
    key = "accept_prob_greedy_draft"
    for i, loc in enumerate(local):
        a, b = narrow.bounds[i], wide.bounds[i]
        truth = _local_values_at(loc, Sampling(temperature=0.0))[key]
        assert np.all(b.low[key] >= a.low[key] - 1e-9) and np.all(b.high[key] <= a.high[key] + 1e-9)
        assert np.all(b.low[key] <= truth + 1e-3) and np.all(truth <= b.high[key] + 1e-3)
