"""export --write-draft: a layer-skip self-draft (self:layers=N), which no engine runs as
such, written as a checkpoint of its own and exported as the draft model. The cut folder,
loaded by transformers, computes what specprobe scored (the LayerSkipDrafter's logits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ModelLoadError
from specprobe.models.cut import cut_config, layer_of
from tests.helpers import one_line_refusal

runner = CliRunner()


def _saved(result, tmp_path: Path, name: str) -> Path:  # type: ignore[no-untyped-def]
    p = tmp_path / name
    p.write_text(result.to_json(), encoding="utf-8")
    return p


def test_the_cut_checkpoint_computes_the_layer_skip_drafters_logits(real_results, tiny_pair, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from specprobe.models.drafters import build_drafter
    from specprobe.models.loader import load_model

    src = _saved(real_results.skip, tmp_path, "skip.json")
    assert real_results.skip.drafter.spec == "self:layers=1"
    draft, out = tmp_path / "draft", tmp_path / "spec.json"
    res = runner.invoke(app, ["export", str(src), "--engine", "vllm", "--write-draft", str(draft), "-o", str(out), "--force"])
    assert res.exit_code == 0, res.output
    spec = json.loads(out.read_text(encoding="utf-8"))
    assert spec["method"] == "draft_model" and spec["model"] == str(draft.resolve())
    assert "first 1 decoder layers" in res.output
    cfg = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    assert cfg["num_hidden_layers"] == 1
    assert (draft / "tokenizer.json").is_file() or (draft / "tokenizer_config.json").is_file()

    target = load_model(str(tiny_pair["target"]))
    skip = build_drafter("self:layers=1", target)
    cut = AutoModelForCausalLM.from_pretrained(str(draft), torch_dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 30, 44, 7]])
    with torch.inference_mode():
        want = skip.step_model()(input_ids=ids).logits
        got = cut(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    # a second export into the same folder keeps it (the same cut)
    res = runner.invoke(app, ["export", str(src), "--engine", "sglang", "--write-draft", str(draft), "-o", str(tmp_path / "s.yaml"), "--force"])
    assert res.exit_code == 0, res.output
    assert f'speculative-draft-model-path: "{draft.resolve()}"' in (tmp_path / "s.yaml").read_text(encoding="utf-8")
    assert "speculative-algorithm: STANDALONE" in (tmp_path / "s.yaml").read_text(encoding="utf-8")


def test_llamacpp_gets_the_conversion_command_for_the_cut(real_results, tmp_path: Path) -> None:
    src = _saved(real_results.skip, tmp_path, "skip.json")
    out = tmp_path / "l.args"
    res = runner.invoke(app, ["export", str(src), "--engine", "llama.cpp", "--write-draft", str(tmp_path / "d"), "-o", str(out), "--force"])
    assert res.exit_code == 0, res.output
    assert "convert_hf_to_gguf.py" in res.output and str((tmp_path / "d").resolve()) in res.output
    assert (tmp_path / "d" / "config.json").is_file()


def test_write_draft_is_refused_for_other_drafters_and_named_when_missing(real_results, tmp_path: Path) -> None:
    twin = _saved(real_results.twin, tmp_path, "twin.json")
    out = tmp_path / "spec.json"
    one_line_refusal(runner.invoke(app, ["export", str(twin), "--engine", "vllm", "--write-draft", str(tmp_path / "d"), "-o", str(out)]), "--write-draft")
    assert not out.exists() and not (tmp_path / "d").exists()
    skip = _saved(real_results.skip, tmp_path, "skip.json")
    one_line_refusal(runner.invoke(app, ["export", str(skip), "--engine", "vllm", "-o", str(out), "--force"]), "--write-draft")
    assert not out.exists()


def test_cut_config_cuts_the_per_layer_lists_and_refuses_out_of_range() -> None:
    cfg = {"num_hidden_layers": 4, "layer_types": ["sliding", "full", "sliding", "full"], "architectures": ["X"], "hidden_size": 8}
    cut = cut_config(cfg, 2)
    assert cut["num_hidden_layers"] == 2 and cut["layer_types"] == ["sliding", "full"] and cut["architectures"] == ["X"]
    assert cfg["num_hidden_layers"] == 4  # the input untouched
    assert cut_config({"n_layer": 12}, 3) == {"n_layer": 3}
    for bad in (0, 4):
        with pytest.raises(ModelLoadError, match="out of range"):
            cut_config(cfg, bad)
    with pytest.raises(ModelLoadError, match="layer count"):
        cut_config({"hidden_size": 8}, 1)
    assert layer_of("model.layers.3.mlp.up_proj.weight") == 3 and layer_of("transformer.h.11.attn.c_attn.weight") == 11
    assert layer_of("gpt_neox.layers.0.attention.dense.weight") == 0
    assert layer_of("model.norm.weight") is None and layer_of("lm_head.weight") is None and layer_of("model.embed_tokens.weight") is None


def test_write_draft_never_replaces_what_is_there(real_results, tmp_path: Path) -> None:
    """A folder of the user's that holds files, or a file, is refused in one line (exit 2)
    and left as it was; nothing else is written."""
    src = _saved(real_results.skip, tmp_path, "skip.json")
    out = tmp_path / "spec.json"
    mine = tmp_path / "models"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine", encoding="utf-8")
    one_line_refusal(runner.invoke(app, ["export", str(src), "--engine", "vllm", "--write-draft", str(mine), "-o", str(out), "--force"]), "already holds files")
    assert [p.name for p in mine.iterdir()] == ["keep.txt"] and not out.exists()
    afile = tmp_path / "a.txt"
    afile.write_text("x", encoding="utf-8")
    one_line_refusal(runner.invoke(app, ["export", str(src), "--engine", "vllm", "--write-draft", str(afile), "-o", str(out), "--force"]), "--write-draft")
    assert afile.read_text(encoding="utf-8") == "x" and not out.exists()
