"""specprobe export --training: the weakest prompts with the target's own on-policy
answers, read back from the reference cache, in SpecForge's and speculators' formats —
read back with the format's rules (roles alternate, every turn present, ids unique), the
answers the very tokens the result scored; a result whose references are not cached is
one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.export.training import SPECFORGE, SPECULATORS, read_back, weakest
from tests.helpers import one_line_refusal as _one_line

runner = CliRunner()




@pytest.fixture()
def skip_result(real_results: Any, tmp_path: Path) -> Path:
    p = tmp_path / "skip.json"
    p.write_text(real_results.skip.to_json(), encoding="utf-8")
    return p


def test_specforge_export_reads_back_with_its_rules(real_results: Any, skip_result: Path, tmp_path: Path) -> None:
    out = tmp_path / "retrain"
    res = runner.invoke(app, ["export", str(skip_result), "--training", "specforge", "-o", str(out), "--budget", "3"])
    assert res.exit_code == 0, res.output
    rows = read_back(SPECFORGE, out / "train.jsonl")
    assert len(rows) == 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == real_results.skip.target.spec
    assert manifest["sampling"]["temperature"] == real_results.skip.sampling.target.temperature
    assert [p["id"] for p in manifest["prompts"]] == [r["id"] for r in rows]
    # the weakest first: each prompt's own α, ascending
    alphas = [p["accept_prob"] for p in manifest["prompts"]]
    assert alphas == sorted(alphas)
    assert {f["rule"] for f in manifest["findings"]} == {f.rule_id for f in real_results.skip.findings}


def test_the_answers_are_the_references_the_result_scored(real_results: Any, skip_result: Path, tmp_path: Path) -> None:
    from specprobe.export.training import references

    prompts, refs, tok = references(real_results.skip, skip_result, lambda m: None)
    out = tmp_path / "spec"
    res = runner.invoke(app, ["export", str(skip_result), "--training", "speculators", "-o", str(out), "--budget", "100"])
    assert res.exit_code == 0, res.output
    rows = read_back(SPECULATORS, out / "train.jsonl")
    by_id = {it.id: i for i, it in enumerate(refs.items)}
    assert {r["id"] for r in rows} == set(by_id)  # every prompt, every turn
    for r in rows:
        i = by_id[r["id"]]
        n = len(refs.encoded[i])
        assert r["input_ids"][:n] == refs.encoded[i] and r["input_ids"][n:] == refs.conts[i]
        assert r["loss_mask"] == [0] * n + [1] * len(refs.conts[i])
        assert r["conversations"][-1]["content"] == tok.decode(refs.conts[i], skip_special_tokens=True)
    # the per-position rows the result kept: positions of exactly these prompts
    assert {pid.split("#")[0] for pid in real_results.skip.positions.prompt_id} == {p.id for p in prompts}


def test_weakest_falls_back_to_the_domain_table(real_results: Any) -> None:
    from specprobe.prompts import load_prompts

    r = real_results.skip.model_copy(update={"positions": None})
    prompts = list(load_prompts(real_results.prompts).prompts)
    picked = weakest(r, prompts, 2)
    worst = min(r.by_domain, key=lambda d: d.accept_prob_mean)
    assert picked[0][0].domain == worst.group and "domain" in picked[0][2]


def test_references_not_in_the_cache_are_one_line(real_results: Any, skip_result: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "empty-cache"))
    out = tmp_path / "retrain"
    _one_line(runner.invoke(app, ["export", str(skip_result), "--training", "specforge", "-o", str(out)]), "not in the reference cache", "specprobe diagnose")
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".retrain")]


def test_training_refusals(skip_result: Path, tmp_path: Path) -> None:
    _one_line(runner.invoke(app, ["export", str(skip_result), "--training", "specforge"]), "-o DIR")
    _one_line(runner.invoke(app, ["export", str(skip_result), "--training", "nope", "-o", str(tmp_path / "x")]), "--training")
    _one_line(runner.invoke(app, ["export", str(skip_result), "--training", "specforge", "--budget", "0", "-o", str(tmp_path / "x")]), "--budget")
    _one_line(runner.invoke(app, ["export", str(skip_result), "--training", "specforge", "-o", str(tmp_path)]), "holds an input")
    _one_line(runner.invoke(app, ["export", str(skip_result), "--training", "specforge", "--engine", "vllm", "-o", str(tmp_path / "x")]), "one of --engine")


def test_every_turn_of_a_multi_turn_prompt_is_exported(tiny_pair: dict[str, Path], tmp_path: Path) -> None:
    """A two-turn question: its second turn was asked after the target's own first answer;
    the export carries both answers, in order, roles alternating."""
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags

    pf = tmp_path / "mt.jsonl"
    pf.write_text("".join(json.dumps({"question_id": i, "category": "writing", "turns": [f"tell me about item {i}", "and once more, shorter"]}) + "\n" for i in range(2)))
    r = run_diagnose(DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(pf), max_new_tokens=6, batch_size=2, k_max=2, cost_ratio=0.1, sampling=SamplingFlags(temperature=1.0)))
    src = tmp_path / "mt.json"
    src.write_text(r.to_json(), encoding="utf-8")
    out = tmp_path / "sf"
    res = runner.invoke(app, ["export", str(src), "--training", "specforge", "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = read_back(SPECFORGE, out / "train.jsonl")
    assert len(rows) == 2
    for row in rows:
        roles = [m["role"] for m in row["conversations"] if m["role"] != "system"]
        assert roles == ["user", "assistant", "user", "assistant"]
    res = runner.invoke(app, ["export", str(src), "--training", "speculators", "-o", str(tmp_path / "sp")])
    assert res.exit_code == 0, res.output
    ids = sorted(x["id"] for x in read_back(SPECULATORS, tmp_path / "sp" / "train.jsonl"))
    assert len(ids) == 4 and sum("#2" in i for i in ids) == 2
