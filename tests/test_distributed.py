"""torchrun: two gloo ranks (a real `torchrun` subprocess on a free port) give the
single-process result; rank detection from torchrun's environment; GPU-marked checks
(bf16 on CUDA against fp32 on the CPU) that skip cleanly without CUDA."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.probe.distributed import active, from_env, is_writer
from tests.helpers.same import REL_OTHER_BATCHING, differences

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(tiny_pair: dict[str, Path], prompts: Path, device: str = "cpu") -> list[str]:
    return [
        "diagnose", str(tiny_pair["target"]), "self:layers=1", "--prompts", str(prompts), "--max-new-tokens", "10", "--batch-size", "2",
        "--k-max", "3", "--temperature", "1.0", "--cost-ratio", "0.1", "--verify-factor", "1.0", "--device", device,
    ]


def test_rank_from_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert from_env() is None and not active() and is_writer()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert from_env() is None  # one rank: an ordinary run
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert from_env() == (3, 4, 1)


def test_two_gloo_ranks_give_the_single_process_result(tiny_pair: dict[str, Path], session_cache: Path, tmp_path: Path) -> None:
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "prompts.jsonl", n=5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run (OMP_NUM_THREADS=1): a GEMM may round differently at another thread count
    try:
        one = runner.invoke(app, [*_args(tiny_pair, pf), "--json", str(tmp_path / "one.json")])
    finally:
        torch.set_num_threads(threads)
    assert one.exit_code in (0, 1), one.output
    env = {**os.environ, "SPECPROBE_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "-m", "specprobe", *_args(tiny_pair, pf), "--json", str(tmp_path / "two.json")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == one.exit_code, proc.stderr[-3000:]
    two, single = json.loads((tmp_path / "two.json").read_text()), json.loads((tmp_path / "one.json").read_text())
    assert differences(single, two, rel=REL_OTHER_BATCHING) == []
    assert two["metrics"]["num_prompts"] == 5 and [f["rule_id"] for f in two["findings"]] == [f["rule_id"] for f in single["findings"]]
    # rank 1 wrote nothing and printed no result: one "wrote" line in the job's output
    assert " ".join(proc.stderr.split()).count(f"wrote {tmp_path / 'two.json'}") == 1  # once (rank 0), wherever a long path wraps
    # each rank saved its part in the cache: a restarted job reuses both
    assert len(list((tmp_path / "cache" / "parts").glob("*/*-of-2.json"))) == 2


needs_cuda = pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_bf16_on_cuda_is_close_to_fp32_on_cpu(tiny_pair: dict[str, Path], tmp_path: Path) -> None:
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "prompts.jsonl", n=4)
    out = {}
    for dev, dtype in (("cpu", "float32"), ("cuda", "bfloat16")):
        r = runner.invoke(app, [*_args(tiny_pair, pf, dev), "--reference", "on-policy", "--temperature", "0", "--dtype", dtype, "--json", str(tmp_path / f"{dev}.json")])
        assert r.exit_code in (0, 1), r.output
        out[dev] = json.loads((tmp_path / f"{dev}.json").read_text())["metrics"]
    # greedy references may differ at a bf16 near-tie: compare the summaries loosely
    assert abs(out["cpu"]["accept_prob_mean"] - out["cuda"]["accept_prob_mean"]) < 0.05


@pytest.mark.gpu
@needs_cuda
def test_fused_scorer_matches_eager_on_cuda() -> None:
    import torch

    from specprobe.metrics import core
    from specprobe.metrics.sampling import Sampling

    g = torch.Generator(device="cuda").manual_seed(0)
    tl = torch.randn(96, 32_000, device="cuda", generator=g) * 4
    dl = tl + torch.randn(96, 32_000, device="cuda", generator=g)
    s = Sampling(temperature=0.7)
    eager = core.position_metrics(tl, dl, s, s)
    fused = core.position_metrics_fused(tl, dl, s, s)
    for f in ("accept_prob", "greedy_agree", "kl_target_draft_nats", "target_entropy_nats", "draft_confidence"):
        torch.testing.assert_close(getattr(fused, f), getattr(eager, f), atol=1e-5, rtol=1e-5)
