"""`diagnose --target-server --engine sglang` against a loopback stand-in for SGLang's
HTTP server (tests/helpers/sglang.py: SGLang 0.5.23's endpoints and answer shapes, read
from its source, files listed there) backed by the real SmolLM2-135M target (fp32,
transformers). The real SGLang does not run here (docs/scale.md, "SGLang"). The drafter
is the target's first 24 layers as a checkpoint of its own; 4 prompts × 24 tokens; one
stand-in for the module.

At T = 0 the served scoring must match the drafter against the target loaded here,
position by position, and `diagnose` with both loaded here must reach the same best K and
verdict. At T = 1 with SGLang's greedy drafting the server scores the drafter's own argmax
(`token_ids_logprob`): every position exact and equal to the local value. Without those
ids (top-5 only) every range holds the local value, for greedy and probabilistic drafting.
Bad input is one line, exit 2, and nothing past the vocabulary reaches the server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specprobe.core.errors import ConfigError, ServerError
from specprobe.engines import get
from tests.helpers.sglang import Target, sglang_emulator
from tests.helpers.vllm import smollm2_pair

pytestmark = pytest.mark.slow

LAYERS, PROMPTS, MAX_TOKENS, K = 24, 4, 24, 4
NAME = "smollm2-target"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return smollm2_pair(tmp_path_factory.mktemp("sglang-remote"), LAYERS, PROMPTS)


@pytest.fixture(scope="module")
def target(pair: dict[str, Any]) -> Target:
    return Target(pair["target"], served_name=NAME)


@pytest.fixture(scope="module")
def server(target: Target) -> Iterator[str]:
    with sglang_emulator(target) as url:
        yield url


def _run(args: list[str], out: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "specprobe", "diagnose", *args, "--engine", "sglang", "--fail-on", "never", "--brief", "--device", "cpu", "--dtype", "float32"]
    if out is not None:
        cmd += ["--json", str(out)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


def _common(pair: dict[str, Any], temperature: str = "0") -> list[str]:
    return ["--prompts", str(pair["prompts"]), "--max-new-tokens", str(MAX_TOKENS), "--temperature", temperature,
            "--k-max", str(K), "--cost-ratio", "0.8", "--verify-factor", "1", "--no-cache"]


def _remote(server: str, pair: dict[str, Any], temperature: str, name: str) -> dict[str, Any]:
    out = pair["work"] / name
    proc = _run(["--target-server", server, str(pair["draft"]), *_common(pair, temperature)], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    result["_stdout"] = proc.stdout
    return result


@pytest.fixture(scope="module")
def remote0(server: str, pair: dict[str, Any]) -> dict[str, Any]:
    return _remote(server, pair, "0", "remote0.json")


def _references(target: Target, pair: dict[str, Any], temperature: float) -> list[tuple[list[int], list[int]]]:
    """The run's prompt ids and the references the server wrote for them (seed 0 + i, as
    diagnose asks), from the stand-in's own log."""
    from specprobe.probe.references import encode_prompt, load_prompt_set
    from specprobe.settings.pipeline import DiagnoseConfig

    prompts = load_prompt_set(DiagnoseConfig(target="", drafter="", prompts=str(pair["prompts"]))).prompts
    seqs = []
    for i, p in enumerate(prompts):
        enc = encode_prompt(target.tok, p)
        seqs.append((enc, target.written[(tuple(enc), temperature, i)]))
    return seqs


def _local(pair: dict[str, Any], seqs: list[tuple[list[int], list[int]]], temperature: float, draft: Any = None) -> list[dict[str, Any]]:
    """The target and drafter loaded here (fp32) over prompt + reference ids: per position
    the metrics `diagnose` computes."""
    import torch

    from specprobe.metrics.core import position_metrics_reference
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.loader import load_model

    t = load_model(str(pair["target"]), "cpu", "float32")
    d = load_model(str(pair["draft"]), "cpu", "float32")
    s = Sampling(temperature=temperature)
    ds = draft or Sampling(temperature=0.0)
    out = []
    with torch.inference_mode():
        for enc, cont in seqs:
            x = torch.tensor([enc + cont])
            m = torch.ones_like(x)
            sl = slice(len(enc) - 1, len(enc) - 1 + len(cont))
            tl = t.head(t.last_hidden(x, m)[0, sl]).float()
            dl = d.head(d.last_hidden(x, m)[0, sl]).float()
            pm = position_metrics_reference(tl, dl, s, ds)
            out.append({"accept_prob_greedy_draft": pm.accept_prob_greedy_draft.double().numpy(), "accept_prob": pm.accept_prob.double().numpy(), "dl": dl, "tl": tl})
    return out


def _served_values(result: dict[str, Any], seqs: list[tuple[list[int], list[int]]], key: str) -> list[np.ndarray]:
    pos = result["positions"]
    ids = list(dict.fromkeys(pos["prompt_id"]))
    got = []
    for pid, (enc, cont) in zip(ids, seqs, strict=True):
        rows = [i for i, x in enumerate(pos["prompt_id"]) if x == pid]
        assert [pos["position"][i] for i in rows] == list(range(len(enc), len(enc) + len(cont)))
        got.append(np.array([pos[key][i] for i in rows]))
    return got


# ----------------------------------------------------------------------------- the client
def test_client_reads_sglangs_answers(server: str, target: Target) -> None:
    s = get("sglang").live_server(server, None)
    assert (s.model, s.version) == (NAME, "0.5.23")
    assert s.tokenizer_name == str(target.path)  # /model_info's tokenizer_path: /v1/models' root is only the served name
    ids = target.tok.encode("The quick brown fox jumps over the lazy dog", add_special_tokens=False)
    assert s.tokenize("The quick brown fox jumps over the lazy dog", 60) == ids
    full = target.logprobs(ids)
    got = s.prompt_logprobs(ids, 5, 60)
    assert len(got.rows) == len(ids) - 1 and got.bytes > 0
    chosen = [5, 17, ids[3]]
    picked = s.prompt_logprobs_chosen(ids, 5, chosen, 60)
    for j, (row, row2) in enumerate(zip(got.rows, picked.rows, strict=True), start=1):
        assert ids[j] in row  # the actual token, whatever its rank
        assert row[ids[j]][0] == pytest.approx(float(full[j - 1, ids[j]]), abs=1e-5)
        top = [t for t, (_, r) in sorted(row.items(), key=lambda kv: kv[1][1]) if r <= 5]
        assert top == full[j - 1].topk(5).indices.tolist()
        assert all(r == 6 for t, (_, r) in row.items() if t not in top)  # no rank from SGLang past the top-n
        for c in chosen:  # the ids asked for, at every position
            assert row2[c][0] == pytest.approx(float(full[j - 1, c]), abs=1e-5)
        assert {t: v for t, v in row2.items() if t in row} == row


def test_client_errors_are_one_line(server: str, target: Target) -> None:
    s = get("sglang").live_server(server, None)
    with pytest.raises(ConfigError, match="does not serve 'llama-405b'") as e:
        get("sglang").live_server(server, "llama-405b")
    assert "--target-model" in e.value.one_line()
    with pytest.raises(ConfigError, match="no top logprobs for --target-logprobs -1"):
        s.prompt_logprobs([1, 2, 3], -1, 60)
    with pytest.raises(ServerError, match="out-of-vocabulary token id 99999999"):  # 400 {"error": {"message": ...}}
        s.prompt_logprobs_chosen([1, 2, 3], 5, [99999999], 60)
    with pytest.raises(ServerError, match="longer than the model's context length"):
        s.prompt_logprobs([1] * target.context_len, 5, 60)
    from specprobe.engines import http

    with pytest.raises(ServerError, match="HTTP 400: Expected `int`, got `str` - at `\\$.input_ids\\[1\\]`"):  # the contract's {"error": "..."}
        http.post_json(server + "/generate", {"input_ids": [1, "two", 3]}, timeout=60, what="SGLang")
    with pytest.raises(ConfigError, match="no cumulative accepted-token counter"):
        s.counters()


def test_a_lora_adapter_is_named_in_each_request(target: Target) -> None:
    with sglang_emulator(target, lora=["sql-adapter"]) as url:
        with pytest.raises(ConfigError, match="serves 2 models"):
            get("sglang").live_server(url, None)
        s = get("sglang").live_server(url, "sql-adapter")
        assert s.lora == "sql-adapter" and s.model == "sql-adapter"  # type: ignore[attr-defined]
        assert get("sglang").live_server(url, NAME).lora is None  # type: ignore[attr-defined]


def test_answers_without_logprobs_are_refused_in_one_line(server: str) -> None:
    from specprobe.engines.sglang.client import rows_from_meta

    with pytest.raises(ServerError, match="without input_token_logprobs, input_top_logprobs"):
        rows_from_meta({"id": "x", "finish_reason": {"type": "length", "length": 1}}, [1, 2], 5)
    meta = {"input_token_logprobs": [[None, 1, None], [-1.0, 2, None]], "input_top_logprobs": [None, [[-1.0, 2, None]]]}
    with pytest.raises(ServerError, match="scored 2 prompt positions of the 3"):
        rows_from_meta(meta, [1, 2, 3], 1)
    with pytest.raises(ServerError, match="scored token 2 at position 1 where 7 was sent"):
        rows_from_meta(meta, [1, 7], 1)
    assert rows_from_meta(meta, [1, 2], 1) == [{2: (-1.0, 1)}]
    meta["input_top_logprobs"] = [None, [[None, 2, "x"]]]  # −inf travels as null
    assert rows_from_meta(meta, [1, 2], 1)[0][2][0] == float("-inf")


# ----------------------------------------------------------------------------- diagnose
def test_greedy_served_scoring_matches_the_local_target(remote0: dict[str, Any], target: Target, pair: dict[str, Any]) -> None:
    r = remote0["remote"]
    assert r["engine"] == "sglang" and r["engine_version"] == "0.5.23"
    assert r["exact"] and r["exact_positions"] == r["positions"] > 0
    assert r["requests"] == PROMPTS and r["bytes"] > 0
    assert r["accept_low"] == r["accept_high"]
    assert remote0["metrics"]["kl_target_draft_nats"] is None  # left out: it needs all of p
    assert "LOW END" not in remote0["_stdout"]
    seqs = _references(target, pair, 0.0)
    local = _local(pair, seqs, 0.0)
    served = _served_values(remote0, seqs, "accept_prob_greedy_draft")
    worst = max(float(np.abs(g - loc["accept_prob_greedy_draft"]).max()) for g, loc in zip(served, local, strict=True))
    assert worst <= 1e-3, worst


def test_greedy_served_diagnose_agrees_with_the_local_one(remote0: dict[str, Any], pair: dict[str, Any]) -> None:
    out = pair["work"] / "local0.json"
    proc = _run([str(pair["target"]), str(pair["draft"]), *_common(pair)], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    local = json.loads(out.read_text())
    assert remote0["metrics"]["best_k"] == local["metrics"]["best_k"]
    assert remote0["verdict"] == local["verdict"]
    assert remote0["metrics"]["accept_prob_engine_mean"] == pytest.approx(local["metrics"]["accept_prob_engine_mean"], abs=1e-3)
    for a, b in zip(remote0["remote"]["k_table"], local["k_table"], strict=True):
        assert a["tau_low"] == pytest.approx(b["tau_renewal_tokens"], rel=1e-3)


@pytest.fixture(scope="module")
def remote1(server: str, pair: dict[str, Any], target: Target) -> dict[str, Any]:
    before = len(target.top_asked)
    result = _remote(server, pair, "1", "remote1.json")
    result["_asked"] = target.top_asked[before:]
    return result


def test_sampled_target_is_exact_with_the_drafters_own_ids(remote1: dict[str, Any], pair: dict[str, Any], target: Target) -> None:
    """T = 1, SGLang's greedy drafting: the drafter runs first and the server scores its
    argmax at every position (token_ids_logprob), so every position is exact at top-20."""
    r1 = remote1
    rem = r1["remote"]
    assert rem["exact"] and rem["exact_positions"] == rem["positions"] > 0, rem
    assert any("drafter's argmax" in n for n in rem["notes"])
    assert "LOW END" not in r1["_stdout"]
    # --target-logprobs' default: once on two tokens before any reference (the server's cap
    # checked first), then once per prompt
    assert r1["_asked"] == [20] * (PROMPTS + 1)
    seqs = _references(target, pair, 1.0)
    local = _local(pair, seqs, 1.0)
    served = _served_values(r1, seqs, "accept_prob_greedy_draft")
    worst = max(float(np.abs(g - loc["accept_prob_greedy_draft"]).max()) for g, loc in zip(served, local, strict=True))
    assert worst <= 1e-3, worst


def test_sampled_target_bounds_contain_the_local_value(remote1: dict[str, Any], server: str, pair: dict[str, Any], target: Target) -> None:
    """T = 1, top-5 alone: where the drafter's argmax is not listed p(argmax q) and α
    are ranges, and each holds the value from the target loaded here; the drafter's ids
    asked beside them make greedy drafting exact."""
    from specprobe.metrics.core import position_metrics_reference
    from specprobe.metrics.remote import TopN, bounded_metrics
    from specprobe.metrics.sampling import Sampling

    seqs = _references(target, pair, 1.0)  # the references remote1's run had written
    t1 = Sampling(temperature=1.0)
    live = get("sglang").live_server(server, None)
    loose = total = 0
    for (enc, cont), loc in zip(seqs, _local(pair, seqs, 1.0), strict=True):
        sl = slice(len(enc) - 1, len(enc) - 1 + len(cont))
        ids = sorted(set(loc["dl"].argmax(-1).tolist()))
        asked = {False: live.prompt_logprobs(enc + cont, 5, 300).rows[sl], True: live.prompt_logprobs_chosen(enc + cont, 5, ids, 300).rows[sl]}
        for draft in (Sampling(temperature=0.0), t1):
            pm = position_metrics_reference(loc["tl"], loc["dl"], t1, draft)
            key = "accept_prob_greedy_draft" if draft.greedy else "accept_prob"
            truth = getattr(pm, key).double().numpy()
            for chosen, rows in asked.items():
                b = bounded_metrics(TopN.from_rows(rows, 5), loc["dl"], t1, draft)
                assert np.all(b.low[key] <= truth + 1e-4) and np.all(truth <= b.high[key] + 1e-4), (chosen, b.low[key], truth, b.high[key])
                if draft.greedy and chosen:
                    assert b.exact.all() and np.abs(b.low[key] - truth).max() <= 1e-4
                elif draft.greedy:
                    loose += int((~b.exact).sum())
                    total += len(cont)
    assert 0 < loose < total  # top-5 alone leaves some positions to a range: the ids close them


@pytest.mark.parametrize("case", ["model", "logprobs", "every_token"])
def test_bad_input_is_one_line_exit_2(case: str, server: str, pair: dict[str, Any], target: Target) -> None:
    args = {
        "model": ["--target-server", server, "--target-model", "llama-405b", str(pair["draft"])],
        "logprobs": ["--target-server", server, "--target-logprobs", str(target.vocab + 1), str(pair["draft"])],
        "every_token": ["--target-server", server, "--target-logprobs", "-1", str(pair["draft"])],
    }[case]
    proc = _run([*args, *_common(pair)])
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    said = proc.stderr.strip()
    assert "Traceback" not in said, said
    want = {"model": "does not serve 'llama-405b'", "logprobs": "than the target's vocabulary (", "every_token": "no 'every token' setting"}[case]
    assert want in said.splitlines()[-1], said
    assert all(k <= target.vocab for k in target.top_asked)  # nothing that would stop a real SGLang was sent


def test_kept_answers_serve_another_drafter_only_where_they_list_its_choice(server: str, pair: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """T = 1, greedy drafting: the kept answers of one drafter's run (its own argmax ids
    scored) are reused by another drafter only where they list that drafter's choice at
    every position; the rest are asked again, so the second run is exact everywhere too.
    Run again, the second drafter asks nothing new."""
    from specprobe.models.cut import write_layer_cut

    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))
    other = write_layer_cut(pair["target"], tmp_path / "draft12", 12)
    common = [c for c in _common(pair, "1") if c != "--no-cache"]

    def run(drafter: Path, name: str) -> dict[str, Any]:
        proc = _run(["--target-server", server, str(drafter), *common], tmp_path / name)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result: dict[str, Any] = json.loads((tmp_path / name).read_text())
        return result

    first = run(pair["draft"], "a.json")["remote"]
    second = run(other, "b.json")["remote"]
    again = run(other, "c.json")["remote"]
    for rem in (first, second, again):
        assert rem["exact"] and rem["exact_positions"] == rem["positions"] > 0, rem
    assert second["requests"] > 0  # the first drafter's answers lacked this one's choices somewhere
    assert again["requests"] == 0 and again["resumed_prompts"] == PROMPTS, again
