"""`check --engine vllm` against the real loader: pairings the real vLLM refuses at startup
are refused by `check` too, with the same cause, before any weight is loaded.

Each broken draft is SmolLM2-135M's 24-layer cut (the draft of tests/test_vllm.py) with
its config.json (and, for the vocabulary, its tensors) rewritten. The healthy pairing
that `check` passes is the one tests/test_vllm.py serves: its module's server starts
from exactly that target and draft, so no third server is started here.

Skipped when vLLM is not installed (SPECPROBE_EXPECT_VLLM=1 makes that a failure).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.vllm import smollm2_pair, vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

K, LAYERS = 4, 24
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return smollm2_pair(tmp_path_factory.mktemp("vllm-check"), LAYERS, 1)


def broken_draft(draft: Path, dst: Path, config: dict[str, Any], *, cut_vocab: int = 0) -> Path:
    """A copy of the draft folder with `config` merged into its config.json; `cut_vocab`
    drops that many rows from the end of the embedding (and an untied lm_head) and
    lowers vocab_size to match, so the checkpoint is consistent in itself."""
    shutil.copytree(draft, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config)
    if cut_vocab:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(dst / "model.safetensors"))
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in tensors:
                tensors[name] = tensors[name][:-cut_vocab].contiguous()
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
        cfg["vocab_size"] = int(cfg["vocab_size"]) - cut_vocab
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def check(target: Path, draft: Path, out: Path) -> tuple[int, dict[str, Any]]:
    cmd = [sys.executable, "-m", "specprobe", "check", str(target), str(draft), "--engine", "vllm", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.is_file(), proc.stderr[-2000:]
    return proc.returncode, json.loads(out.read_text())


def refused(vllm_python: Path, target: Path, draft: Path, log: Path) -> str:
    """The whole log of a vLLM server that must exit during startup."""
    with pytest.raises(RuntimeError, match="exited with"), vllm_server(vllm_python, target, draft, K, log, startup_timeout=600):
        pass
    return log.read_text(errors="replace")


def errors(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["rule_id"]: f for f in result["findings"] if f["severity"] == "error"}


def test_another_vocabulary_is_refused_by_both(vllm_python: Path, pair: dict[str, Any]) -> None:
    """A draft with 200 fewer vocabulary rows (embedding cut, vocab_size 48952): vLLM
    refuses it while building its config, 'Target and draft model should have the same
    vocabulary size'; check says so (SP035, SP001) from config.json alone."""
    work = pair["work"]
    draft = broken_draft(pair["draft"], work / "draft-vocab", {}, cut_vocab=200)
    rc, result = check(pair["target"], draft, work / "check-vocab.json")
    found = errors(result)
    assert rc == 1 and {"SP035", "SP001"} <= set(found), result["findings"]
    said = json.dumps(found["SP035"])
    assert "Target and draft model should have the same vocabulary size" in said and "48952" in said
    log = refused(vllm_python, pair["target"], draft, work / "vllm-vocab.log")
    assert "Target and draft model should have the same vocabulary size" in log
    assert "Target model vocab_size=49152. Draft model vocab_size=48952." in log


def test_an_mrope_draft_is_refused_by_both(vllm_python: Path, pair: dict[str, Any]) -> None:
    """The same draft declaring M-RoPE (`mrope_section` in its rope parameters, as Qwen2-VL
    style configs write it): vLLM's draft-model proposer refuses it while the worker
    starts, before loading weights; check names the same cause from config.json (SP038)."""
    work = pair["work"]
    rope = {"rope_theta": 100000.0, "rope_type": "default", "mrope_section": [16, 8, 8]}
    draft = broken_draft(pair["draft"], work / "draft-mrope", {"rope_parameters": rope})
    rc, result = check(pair["target"], draft, work / "check-mrope.json")
    found = errors(result)
    assert rc == 1 and set(found) == {"SP038"}, result["findings"]
    said = json.dumps(found["SP038"])
    assert "does not support M-RoPE yet" in said and "mrope_section = [16, 8, 8]" in said
    log = refused(vllm_python, pair["target"], draft, work / "vllm-mrope.log")
    assert "Speculative Decoding with draft models or parallel drafting does not support M-RoPE yet" in log
