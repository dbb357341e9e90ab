"""What a new user reads first (issue 21): the explain header and the what-if sample in
words, a folder without a tokenizer, a head folder that does not exist, and a head's
facts on check's console."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ModelLoadError

runner = CliRunner()


def _text(res) -> str:
    return " ".join(res.output.split())


@pytest.mark.parametrize(
    ("n", "word"),
    [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (13, "13th"), (21, "21st"), (22, "22nd"), (23, "23rd"), (101, "101st"), (111, "111th"), (112, "112th")],
)
def test_ordinals(n, word) -> None:
    from specprobe.report.drill_html import ordinal, sample_phrase

    assert ordinal(n) == word
    assert sample_phrase(n) == ("every prompt" if n == 1 else f"every {word} prompt")


@pytest.fixture(scope="module")
def drilled(tiny_pair, tmp_path_factory):
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    root = tmp_path_factory.mktemp("drill")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECPROBE_CACHE_DIR", str(root / "cache"))
        r = run_diagnose(DiagnoseConfig(
            target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(prompts_file(root / "p.jsonl")), max_new_tokens=8,
            batch_size=3, k_max=3, cost_ratio=0.1, sampling=SamplingFlags(temperature=1.0),
        ))
    assert r.drilldown is not None and r.drilldown.counterfactuals is not None
    # the sample a large run takes: every 2nd prompt
    cf = r.drilldown.counterfactuals.model_copy(update={"every": 2})
    return r.model_copy(update={"drilldown": r.drilldown.model_copy(update={"counterfactuals": cf})})


def test_explain_header_is_one_sentence_and_says_every_2nd_prompt(drilled, tmp_path) -> None:
    from specprobe.report.drill_html import drill_section

    f = tmp_path / "r.json"
    f.write_text(drilled.model_dump_json())
    res = runner.invoke(app, ["explain", str(f)], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    text = _text(res)
    assert "p: the target's probability, q: the drafter's — each side's untruncated tempered softmax (T = 1 when greedy)" in text
    assert "each from its" not in text
    assert "on every 2nd prompt:" in text and "2th" not in text
    html = drill_section(drilled)
    assert "every 2nd prompt" in html and "2th" not in html


def _without_tokenizer(src: Path, dest: Path, keep: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dest)
    for f in dest.iterdir():
        if ("token" in f.name or f.name == "special_tokens_map.json") and f.name not in keep:
            f.unlink()
    return dest


def test_a_folder_without_a_tokenizer_names_the_missing_file(tiny_pair, tmp_path) -> None:
    from specprobe.models.loader import load_info

    bare = _without_tokenizer(tiny_pair["target"], tmp_path / "bare")
    with pytest.raises(ModelLoadError) as info:
        load_info(str(bare))
    line = info.value.one_line()
    assert line.startswith(f"cannot load the tokenizer in {bare}: no vocabulary file — none of tokenizer.json, tokenizer.model")
    assert "tokenizer_config.json" in line and not line.rstrip().endswith("one of:") and "from one of: —" not in line
    assert "copy tokenizer.json" in info.value.hint
    # tokenizer_config.json alone makes a tokenizer of a few special tokens: refused too
    only_cfg = _without_tokenizer(tiny_pair["target"], tmp_path / "cfg", keep=("tokenizer_config.json",))
    with pytest.raises(ModelLoadError, match=r"tokenizer_config.json is there but none of tokenizer.json"):
        load_info(str(only_cfg))
    # the CLI says it on one line
    res = runner.invoke(app, ["check", str(bare), "self:layers=1"])
    assert res.exit_code == 2 and "none of tokenizer.json" in _text(res)


def test_a_missing_head_folder_is_one_message_for_check_and_diagnose(tiny_pair, tmp_path) -> None:
    missing = tmp_path / "no-such-head"
    said = []
    for cmd in ("check", "diagnose"):
        res = runner.invoke(app, [cmd, str(tiny_pair["target"]), f"eagle3:{missing}"])
        assert res.exit_code == 2, res.output
        said.append(next(line for line in res.output.splitlines() if line.startswith("error:")))
    assert said[0] == said[1]
    assert said[0].startswith(f"error: model path {missing} does not exist — pass the folder that holds the head's config.json and weights (eagle3:PATH)")
    # a folder that is there but holds no config.json keeps its own message
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, ["check", str(tiny_pair["target"]), f"eagle3:{tmp_path / 'empty'}"])
    assert "is not a head checkpoint folder (no config.json)" in _text(res)


def test_check_prints_a_heads_facts_on_the_console(tiny_pair, tmp_path) -> None:
    from tests.helpers.heads import eagle3_speculators, medusa_vllm

    target = tiny_pair["target"]
    head = eagle3_speculators(tmp_path / "e3", target, vd=100)
    res = runner.invoke(app, ["check", str(target), str(head), "--json", str(tmp_path / "c.json")], env={"COLUMNS": "80"})
    assert res.exit_code in (0, 1), res.output
    facts = json.loads((tmp_path / "c.json").read_text())["alignment"]["facts"]["head"]
    text = _text(res)
    assert f"head EAGLE-3 (speculators) {head}" in text
    assert f"fc input {facts['hidden']['fc_in']} = 3 × 64" in text
    assert "draft vocabulary 100 of the target's 284 ids (35.2%); d2t valid, t2d consistent" in text
    aux = facts["aux_layers"]
    assert f"aux layers ids [0, 1, 2]: vLLM reads hidden_states[{', '.join(map(str, aux['vllm']))}], SGLang [{', '.join(map(str, aux['sglang']))}]" in text
    assert "verifier target (LlamaForCausalLM)" in text
    res = runner.invoke(app, ["check", str(target), str(medusa_vllm(tmp_path / "med", target))], env={"COLUMNS": "80"})
    assert "3 Medusa heads × 2 layers, lm_head own" in _text(res)
    # a drafter that is not a head prints no head block
    res = runner.invoke(app, ["check", str(target), "self:layers=1"])
    assert "head " not in res.output.replace("ahead", "")
