"""Token-level drill-down, what-ifs, `explain` and `sweep`.

Broken twins built from the tiny target: an output-shuffled one (its LM head rows
permuted: the d2t / id-map error of a head drafter, whose inputs are the target's own)
and an off-by-one one (rows rolled by one id); the hot-sampling pair; a sweep that
must run the target's teacher-forced pass once per batch whatever the drafters."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ConfigError
from specprobe.metrics.sampling import Sampling
from specprobe.probe.counterfactual import Chain, accept_prob, domain_gains, vocab_ceiling
from specprobe.probe.diagnose import run_diagnose
from specprobe.probe.drilldown import token_class
from specprobe.probe.sweep import parse_layers
from specprobe.report.html import render_html
from specprobe.result import Result
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
from tests.helpers import runs_without
from tests.helpers.tiny import _tokenizer, base_vocab, prompts_file, save

runner = CliRunner()


def _cfg(tiny_pair: dict[str, Path], drafter: str, prompts: Path, **kw: Any) -> DiagnoseConfig:
    base: dict[str, Any] = dict(target=str(tiny_pair["target"]), drafter=drafter, prompts=str(prompts), max_new_tokens=12, batch_size=4, k_max=4, cost_ratio=0.1, verify_factor=1.0, sampling=SamplingFlags(temperature=1.0))
    return DiagnoseConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prompts_file(tmp_path_factory.mktemp("dd-prompts") / "prompts.jsonl")


def _head_twin(tiny_pair: dict[str, Path], path: Path, rows: torch.Tensor) -> Path:
    """The target with LM head row rows[j] holding the target's row j: the drafter's id
    rows[j] carries the target's token j (inputs untouched)."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_pair["target"])
    with torch.no_grad():
        w = m.lm_head.weight.clone()
        m.lm_head.weight[rows] = w
    return save(m, _tokenizer(base_vocab()), path)


@pytest.fixture(scope="module")
def shuffled(tiny_pair: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    n = len(base_vocab())
    perm = torch.arange(n)
    perm[4:] = 4 + torch.randperm(n - 4, generator=torch.Generator().manual_seed(3))
    return _head_twin(tiny_pair, tmp_path_factory.mktemp("dd") / "out-shuffled", perm), perm


@pytest.fixture(scope="module")
def saved(real_results: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("dd-saved") / "skip.json"
    p.write_text(real_results.skip.to_json(), encoding="utf-8")
    return p


# ----------------------------------------------------------------------------- closed forms
def test_counterfactual_maths_in_closed_form() -> None:
    x = torch.randn(6, 40)
    t1 = Sampling(1.0)
    assert torch.allclose(accept_prob(x, x.clone(), t1, t1), torch.ones(6), atol=1e-6)
    y = torch.randn(6, 40)
    agree = (x.argmax(-1) == y.argmax(-1)).float()
    assert torch.equal(accept_prob(x, y, Sampling(0.0), Sampling(0.0)), agree)
    # a drafter 10 ids short proposes none of them: the ceiling is the target's mass on the rest
    p = torch.softmax(x, -1)
    assert torch.allclose(vocab_ceiling(x, y[:, :30], t1), p[:, :30].sum(-1), atol=1e-6)
    assert torch.equal(vocab_ceiling(x, y, t1), torch.ones(6))
    # τ of a constant α chained along a long sequence -> 1 + α + α² + … (the i.i.d. form)
    c = Chain(3)
    c.add(np.full(10_000, 0.5))
    assert c.mean == 0.5 and c.tau(3) == pytest.approx(1 + 0.5 + 0.25 + 0.125, abs=1e-3)


def test_token_classes_and_domain_ranking() -> None:
    assert [token_class(t, False) for t in (" ", "\n\n", ",", " the", "2024", " 3.5", "{", " ==", "->")] == [
        "whitespace/punct", "whitespace/punct", "whitespace/punct", "words", "digits", "digits", "code symbols", "code symbols", "code symbols",
    ]
    assert token_class("</s>", True) == "special"
    rows = domain_gains([{"group": "chat", "positions": 100, "accept_prob_mean": 0.8}, {"group": "code", "positions": 300, "accept_prob_mean": 0.5}, {"group": "math", "positions": 100, "accept_prob_mean": 0.4}], 0.54)
    assert [r["domain"] for r in rows] == ["code", "math", "chat"]
    assert rows[0]["gain_if_best"] == pytest.approx(300 / 500 * 0.3)


def test_parse_layers() -> None:
    assert parse_layers("16..19") == [16, 17, 18, 19]
    assert parse_layers("20, 24,22..23") == [20, 22, 23, 24]
    for bad in ("29..16", "a..b", "0", ""):
        with pytest.raises(ConfigError):
            parse_layers(bad)


# ----------------------------------------------------------------------------- broken twins
def test_output_shuffled_twin_names_the_shuffled_pairs(tiny_pair: dict[str, Path], prompts: Path, shuffled: tuple[Path, torch.Tensor]) -> None:
    path, perm = shuffled
    r = run_diagnose(_cfg(tiny_pair, str(path), prompts))
    dd = r.drilldown
    assert dd is not None and r.metrics["accept_prob_mean"] < 0.3
    top = dd.confusions[:5]
    assert len(top) == 5 and all(c.draft == int(perm[c.target]) for c in top), [(c.target, c.draft) for c in top]
    # every confused position's pair is a shuffled pair, and the drafter over-proposes their images
    assert sum(c.count for c in dd.confusions if c.draft == int(perm[c.target])) / sum(c.count for c in dd.confusions) > 0.9
    assert {o.token for o in dd.over_proposed[:3]} <= {int(perm[c.target]) for c in dd.confusions}


def test_off_by_one_mapping_top_confusion_is_the_neighbour(tiny_pair: dict[str, Path], prompts: Path, tmp_path: Path) -> None:
    n = len(base_vocab())
    path = _head_twin(tiny_pair, tmp_path / "off-by-one", (torch.arange(n) + 1) % n)
    r = run_diagnose(_cfg(tiny_pair, str(path), prompts, sampling=SamplingFlags(temperature=0.7)))
    dd = r.drilldown
    assert dd is not None and dd.confusions
    assert dd.confusions[0].draft == dd.confusions[0].target + 1
    neighbours = sum(c.count for c in dd.confusions if c.draft == (c.target + 1) % n)
    assert neighbours / sum(c.count for c in dd.confusions) > 0.8
    # the evidence names the tokens: text for every id, the worst positions with both top-5
    assert all(c.target in dd.vocab and c.draft in dd.vocab for c in dd.confusions)
    w = dd.worst[0]
    assert len(w.target.ids) == 5 and len(w.draft.ids) == 5 and w.draft.ids[0] == w.target.ids[0] + 1


def test_temperature_mismatch_aligned_settings_recover_alpha_one(tiny_pair: dict[str, Path], prompts: Path) -> None:
    """An identical model sampled hotter: α < 1, and the what-if with the target's
    settings is exactly 1 — the whole loss is configuration, and SP212 says so."""
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["hot"]), prompts, sampling=SamplingFlags(temperature=1.0, draft_temperature=50.0)))
    cf = r.drilldown.counterfactuals  # type: ignore[union-attr]
    assert cf is not None and cf.every == 2 and cf.sample_prompts >= 2  # every second prompt
    rows = {w.key: w for w in cf.rows}
    al = rows["aligned_sampling"]
    assert al.accept_prob_real is not None and al.accept_prob_real < 0.9
    assert al.accept_prob == pytest.approx(1.0, abs=1e-5)
    assert al.tau_tokens == pytest.approx(1 + cf.k, abs=1e-4) and al.tau_tokens_real < al.tau_tokens  # type: ignore[operator]
    assert r.metrics["accept_prob_aligned_sampling"] == pytest.approx(1.0, abs=1e-5)
    assert r.metrics["accept_prob_config_loss_frac"] > 0.2
    assert "SP212" in {f.rule_id for f in r.findings}
    assert rows["greedy"].accept_prob == 1.0 and rows["vocab_ceiling"].accept_prob == 1.0
    # the same pair with matching settings: no aligned row, no config metric
    same = run_diagnose(_cfg(tiny_pair, str(tiny_pair["hot"]), prompts))
    assert "aligned_sampling" not in {w.key for w in same.drilldown.counterfactuals.rows}  # type: ignore[union-attr]
    assert same.metrics["accept_prob_config_loss_frac"] is None


def test_every_prompt_every_token(real_results: Any) -> None:
    r = real_results.skip
    dd = r.drilldown
    assert dd is not None and dd.positions == r.metrics["num_positions"]
    assert sum(len(p.tokens) for p in dd.prompts) == dd.positions
    assert [p.accept_prob_mean for p in dd.prompts] == sorted(p.accept_prob_mean for p in dd.prompts)  # type: ignore[type-var]
    for p in dd.prompts:
        n = len(p.tokens)
        assert all(len(c) == n for c in (p.accept_prob, p.kl_target_draft_nats_by_token, p.target_top1, p.target_top1_prob, p.draft_top1, p.draft_top1_prob))
        assert p.tops is not None and len(p.tops.target_ids) == n  # ≤ 8 prompts: all keep top-5
    # α per prompt matches the per-position rows
    pos = r.positions
    assert pos is not None
    first = dd.prompts[0]
    mine = [a for pid, a in zip(pos.prompt_id, pos.accept_prob, strict=True) if pid == first.prompt_id]
    assert np.allclose(mine, first.accept_prob, atol=1e-3)
    assert sum(c.positions for c in dd.token_classes) == dd.positions


# ----------------------------------------------------------------------------- size
def test_result_for_480_prompts_of_128_tokens_stays_small() -> None:
    from benchmarks.bench_drilldown import synthetic_section

    section = synthetic_section(480, 128)
    from specprobe.result import DrillDown

    text = json.dumps(DrillDown.model_validate(section).model_dump(mode="json"), indent=1, ensure_ascii=False)
    assert len(text.encode()) < 20_000_000
    assert len(section["prompts"]) == 480 and sum(p["tops"] is not None for p in section["prompts"]) == 8


# ----------------------------------------------------------------------------- explain
def test_explain_views(saved: Path) -> None:
    res = runner.invoke(app, ["explain", str(saved)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "What-ifs" in res.output and "token class" in res.output and "Systematic confusions" in res.output
    doc = json.loads(saved.read_text(encoding="utf-8"))
    pid = doc["drilldown"]["prompts"][0]["prompt_id"]
    res = runner.invoke(app, ["explain", str(saved), "--prompt", pid, "--worst", "2", "--confusions", "--by", "kl"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert pid in res.output and "target top-5" in res.output and "drafter top-5" in res.output and "Over-proposed" in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80


def test_explain_bad_input_exit_2(saved: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["explain", str(saved), "--prompt", "no-such-prompt"])
    assert res.exit_code == 2 and "no prompt 'no-such-prompt'" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    doc = json.loads(saved.read_text(encoding="utf-8"))
    doc.pop("drilldown")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc), encoding="utf-8")
    res = runner.invoke(app, ["explain", str(old)])
    assert res.exit_code == 2 and "no token-level drill-down" in res.stderr
    assert runner.invoke(app, ["explain", str(saved), "--worst", "2", "--by", "beta"]).exit_code == 2


def test_explain_runs_without_torch(saved: Path) -> None:
    """torch cannot even be imported: explain must still render every view."""
    runs_without(
        [["'explain'", repr(str(saved)), "'--prompt'", "pid", "'--worst'", "'3'", "'--confusions'"], ["'explain'", repr(str(saved))]],
        ("transformers", "safetensors", "accelerate"), block_torch=True,
        setup=f"import json\npid = json.load(open({str(saved)!r}))['drilldown']['prompts'][0]['prompt_id']\n",
    )


# ----------------------------------------------------------------------------- HTML
def test_html_heat_map_and_confusions(real_results: Any) -> None:
    html = render_html(real_results.skip)
    assert '<section id="drilldown">' in html and "Systematic confusions" in html
    heat = re.findall(r'<div class="heat" id="heat-([^"]+)">', html)
    assert heat and heat[0] == real_results.skip.drilldown.prompts[0].prompt_id
    assert html.count('class="tk"') == sum(len(p.tokens) for p in real_results.skip.drilldown.prompts[: len(heat)])
    # each hover holds both sides' top-5; still no script, no external resource
    tip = re.search(r'<span class="tip">(.*?)</span>', html, re.S)
    assert tip and "target" in tip.group(1) and "drafter" in tip.group(1) and tip.group(1).count("\n") >= 6
    section = html[html.index('<section id="drilldown">') :]
    section = section[: section.index("</section>")]
    assert "<script" not in html and "http" not in section
    assert "default-src 'none'" in html  # the page's CSP is untouched


def test_heat_map_renders_in_chromium(real_results: Any, tmp_path: Path) -> None:
    from tests.test_report_browser import CHROMIUM, _chromium, _console_errors

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium); .ci/run installs it")
    page = tmp_path / "drill.html"
    page.write_text(render_html(real_results.skip), encoding="utf-8")
    dom = _chromium(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=2000", "--dump-dom", page.resolve().as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not _console_errors(dom.stderr), _console_errors(dom.stderr)
    assert dom.stdout.count('class="tk"') > 10 and 'id="drilldown"' in dom.stdout


# ----------------------------------------------------------------------------- sweep
def test_sweep_runs_the_target_pass_once(tiny_pair: dict[str, Path], prompts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specprobe.models.loader import load_model
    from specprobe.probe.sweep import run_sweep

    cfg = _cfg(tiny_pair, "self:layers=1", prompts, seed=5)
    target = load_model(cfg.target, "cpu", "float32")
    calls = {"forward": 0, "generate": 0}
    real_last, real_gen = target.last_hidden, target.model.generate

    def last_hidden(*a: Any, **k: Any) -> Any:
        calls["forward"] += 1
        return real_last(*a, **k)

    def generate(*a: Any, **k: Any) -> Any:
        calls["generate"] += 1
        return real_gen(*a, **k)

    monkeypatch.setattr(target, "last_hidden", last_hidden)
    monkeypatch.setattr(target.model, "generate", generate)
    drafters = ["self:layers=1", str(tiny_pair["twin"]), "self"]
    sw = run_sweep(cfg, drafters, target=target)
    batches = -(-6 // cfg.batch_size)
    assert sw.report.target_passes == batches and calls["forward"] == batches  # not once per drafter
    assert 1 <= calls["generate"] <= batches  # references generated once (one generate per batch)
    rows = {r.drafter: r for r in sw.report.rows}
    assert rows["self"].accept_prob_mean == pytest.approx(1.0, abs=1e-6) and rows[str(tiny_pair["twin"])].accept_prob_mean == pytest.approx(1.0, abs=1e-6)
    assert rows["self:layers=1"].accept_prob_mean < 0.9
    assert sw.report.recommended in ("self", str(tiny_pair["twin"]))
    assert len(rows["self"].speedup_by_k) == cfg.k_max
    # the same numbers as a diagnose run of that drafter on the same references
    alone = run_diagnose(_cfg(tiny_pair, "self:layers=1", prompts, seed=5))
    assert sw.results[0].metrics["accept_prob_mean"] == pytest.approx(alone.metrics["accept_prob_mean"], abs=1e-9)
    assert sw.results[0].drilldown is not None


def test_sweep_cli(tiny_pair: dict[str, Path], prompts: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, [
        "sweep", str(tiny_pair["target"]), str(tiny_pair["twin"]), "--layers", "1", "--prompts", str(prompts), "--max-new-tokens", "8",
        "--k-max", "3", "--cost-ratio", "0.1", "--verify-factor", "1", "--temperature", "1", "--json", str(tmp_path / "sweep.json"), "--results", str(tmp_path / "each"),
        "--draft-top-p", "1", "--html", str(tmp_path / "sweep.html"), "--csv", str(tmp_path / "tables"), "--fail-on", "never",
    ], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    html = (tmp_path / "sweep.html").read_text(encoding="utf-8")
    assert "specprobe sweep" in html and "self:layers=1" in html and "<svg" in html
    import pandas as pd

    table = pd.read_csv(tmp_path / "tables" / "sweep.csv")
    assert set(table["drafter"]) == {str(tiny_pair["twin"]), "self:layers=1"} and len(table) == 2
    assert {"tau_k1", "tau_k3", "speedup_k3", "recommended"} <= set(table.columns) and table["recommended"].sum() == 1
    assert "recommended:" in res.output and "self:layers=1" in res.output
    doc = json.loads((tmp_path / "sweep.json").read_text(encoding="utf-8"))
    assert doc["command"] == "sweep" and len(doc["rows"]) == 2 and doc["target_passes"] >= 1
    each = Result.model_validate_json((tmp_path / "each" / "self_layers_1.json").read_text(encoding="utf-8"))
    assert each.drilldown is not None
    # τ and speedup at the drafter's best K carry that K row's standard errors, in the JSON and the table
    row = next(r for r in doc["rows"] if r["drafter"] == "self:layers=1")
    best = next(k for k in each.k_table if k.k == each.best_k)
    assert row["tau_tokens_se"] == pytest.approx(best.tau_renewal_se) and row["speedup_best_se"] == pytest.approx(best.speedup_se)
    assert best.tau_renewal_se is not None and f"{row['tau_tokens']:.2f} ± {best.tau_renewal_se:.2f}" in res.output
    assert row["tau_by_k"][each.best_k - 1] == pytest.approx(row["tau_tokens"])  # one τ: the same figure per K as at the best
    bad = runner.invoke(app, ["sweep", str(tiny_pair["target"])])
    assert bad.exit_code == 2 and "drafters" in bad.stderr
