"""diagnose with draft trees on the tiny checkpoints: the tree section, the chain read off
the grid equal to the K table, an identical drafter accepting the whole depth, static
trees, the merge of tree sums, and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.metrics.tree import TreeAccumulator
from specprobe.probe.diagnose import run_diagnose
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
from tests.helpers.tiny import prompts_file


@pytest.fixture(scope="module")
def pf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prompts_file(tmp_path_factory.mktemp("tree-prompts") / "prompts.jsonl")


def _cfg(tiny_pair: dict[str, Path], pf: Path, drafter: str, **kw: Any) -> DiagnoseConfig:
    base: dict[str, Any] = dict(target=str(tiny_pair["target"]), drafter=drafter, prompts=str(pf), max_new_tokens=12, batch_size=4, k_max=4,
                                cost_ratio=0.1, verify_factor=1.0, engine="sglang", tree="steps=3,topk=4,tokens=8")
    return DiagnoseConfig(**{**base, **kw})


def test_tree_section_and_the_chain_it_holds(tiny_pair: dict[str, Path], pf: Path) -> None:
    r = run_diagnose(_cfg(tiny_pair, pf, "self:layers=1", sampling=SamplingFlags(temperature=1.0)))
    t = r.trees
    assert t is not None and t.tree is not None
    assert (t.tree.steps, t.tree.topk, t.tree.tokens) == (3, 4, 8)
    assert len(t.tree.depth_accept) == 3 and len(t.tree.rank_shares) == 3
    for shares in t.tree.rank_shares:
        assert sum(x for x in shares if x is not None) == pytest.approx(1.0, abs=1e-5)  # shares rounded to 6 places
    # the grid's chains (topk 1) are the K table: same renewal τ, same speedup
    chains = {row.steps: row for row in t.grid if row.topk == 1}
    for k in r.k_table:
        assert chains[k.k].tau_tokens == pytest.approx(k.tau_renewal_tokens, abs=1e-6)
        assert chains[k.k].speedup == pytest.approx(k.speedup, abs=1e-6)
        assert chains[k.k].tau_window_tokens == pytest.approx(k.tau_tokens, abs=1e-6)
    assert t.tree.chain_tau_tokens == pytest.approx(chains[3].tau_tokens)
    # the whole tree (every expanded node verified) never accepts less than its chain
    full = next(row for row in t.grid if (row.steps, row.topk, row.tokens) == (3, 4, 16))
    assert full.tau_tokens >= chains[3].tau_tokens - 1e-9
    assert t.best_tree is not None and t.best_chain is not None
    assert r.metrics["tree_tau_tokens"] == pytest.approx(t.tree.tau_tokens)
    assert r.metrics["tree_best_vs_chain"] is not None


def test_identical_drafter_accepts_every_depth(tiny_pair: dict[str, Path], pf: Path) -> None:
    r = run_diagnose(_cfg(tiny_pair, pf, str(tiny_pair["twin"]), sampling=SamplingFlags(temperature=0.0)))
    t = r.trees
    assert t is not None and t.tree is not None
    # greedy target, identical drafter: its rank-1 candidate is always the target's token
    assert t.tree.depth_accept == pytest.approx([1.0, 1.0, 1.0])
    assert t.tree.rank_shares[0][0] == pytest.approx(1.0)


def test_static_tree(tiny_pair: dict[str, Path], pf: Path) -> None:
    r = run_diagnose(_cfg(tiny_pair, pf, "self:layers=1", tree="[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]", sampling=SamplingFlags(temperature=1.0)))
    t = r.trees
    assert t is not None and t.tree is not None
    assert t.tree.paths == [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    assert (t.tree.steps, t.tree.topk, t.tree.tokens) == (3, 2, 7)
    assert 1.0 <= t.tree.tau_tokens <= 4.0


def test_tree_sums_merge_by_adding() -> None:
    rng = np.random.default_rng(3)
    from specprobe.estimates.tree import parse

    def seq(n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        q = -np.sort(-rng.dirichlet(np.ones(10), size=n), axis=1)[:, :8]
        a = rng.uniform(0, 0.3, size=(n, 8))
        return [q] * 3, [a] * 3

    seqs = [seq(n) for n in (9, 14, 20)]
    whole = TreeAccumulator(3, 8, parse("steps=3,topk=4,tokens=8"))
    for s in seqs:
        whole.add_sequence(*s)
    a, b = TreeAccumulator(3, 8, parse("steps=3,topk=4,tokens=8")), TreeAccumulator(3, 8, parse("steps=3,topk=4,tokens=8"))
    a.add_sequence(*seqs[0])
    for s in seqs[1:]:
        b.add_sequence(*s)
    merged = TreeAccumulator.from_state(a.to_state()).merge(b)
    own_w, own_m = whole.own, merged.own
    assert own_w is not None and own_m is not None
    assert own_m.tau() == pytest.approx(own_w.tau(), abs=1e-12)
    np.testing.assert_allclose(own_m.by_rank, own_w.by_rank, atol=1e-12)


@pytest.mark.parametrize("args, words", [
    (["--tree", "steps=3,topk=4,tokens=8"], "vLLM verifies chains"),
    (["--tree", "steps=3,topk=4,tokens=99", "--engine", "sglang"], "does not fit"),
    (["--tree", "steps=9,topk=2,tokens=8", "--engine", "sglang"], "deeper than --k-max"),
])
def test_refusals_are_one_line(tiny_pair: dict[str, Path], args: list[str], words: str) -> None:
    res = CliRunner().invoke(app, ["diagnose", str(tiny_pair["target"]), "self:layers=1", *args])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert any(words in x for x in lines) and lines[0].startswith("error:")


def test_serving_configs_name_their_tree(tmp_path: Path) -> None:
    from specprobe.settings.options import merge
    from tests.test_serving import _params

    sg = tmp_path / "sglang.yaml"
    sg.write_text("model-path: /m/llama\nspeculative-algorithm: EAGLE3\nspeculative-draft-model-path: /m/eagle3\n"
                  "speculative-num-steps: 3\nspeculative-eagle-topk: 4\nspeculative-num-draft-tokens: 8\n")
    opts = merge("diagnose", _params("diagnose", serving_config=[sg]), {"serving_config"})
    assert opts.values["engine"] == "sglang"
    assert opts.values["tree"] == "steps=3,topk=4,tokens=8"
    assert opts.origins["tree"].endswith("speculative-eagle-topk")
    chain = tmp_path / "chain.yaml"
    chain.write_text("model-path: /m/llama\nspeculative-algorithm: EAGLE3\nspeculative-draft-model-path: /m/eagle3\n"
                     "speculative-num-steps: 3\nspeculative-eagle-topk: 1\nspeculative-num-draft-tokens: 4\n")
    assert merge("diagnose", _params("diagnose", serving_config=[chain]), {"serving_config"}).values["tree"] is None
    trt = tmp_path / "extra.yaml"
    trt.write_text("speculative_config:\n  decoding_type: Eagle\n  max_draft_len: 3\n  speculative_model_dir: /m/eagle\n"
                   "  eagle_choices: [[0], [1], [0, 0], [0, 1], [0, 0, 0]]\n")
    opts = merge("diagnose", _params("diagnose", serving_config=[trt]), {"serving_config"})
    assert opts.values["tree"] == "[[0],[1],[0,0],[0,1],[0,0,0]]"
    dyn = tmp_path / "dyn.yaml"
    dyn.write_text("speculative_config:\n  decoding_type: Eagle\n  max_draft_len: 4\n  speculative_model_dir: /m/eagle\n"
                   "  use_dynamic_tree: true\n  dynamic_tree_max_topK: 3\n  max_total_draft_tokens: 15\n")
    assert merge("diagnose", _params("diagnose", serving_config=[dyn]), {"serving_config"}).values["tree"] == "steps=4,topk=3,tokens=16"
    # a typed --tree wins over the file's
    typed = merge("diagnose", _params("diagnose", serving_config=[sg], tree="steps=2,topk=2,tokens=4"), {"serving_config", "tree"})
    assert typed.values["tree"] == "steps=2,topk=2,tokens=4"


def test_export_writes_the_tree_and_reads_back(tiny_pair: dict[str, Path], pf: Path, tmp_path: Path) -> None:
    from specprobe.settings.serving import read_serving_config, tree_setting

    r = run_diagnose(_cfg(tiny_pair, pf, str(tiny_pair["twin"]), sampling=SamplingFlags(temperature=1.0)))
    res = tmp_path / "r.json"
    res.write_text(r.to_json())
    run = CliRunner()
    out = tmp_path / "sglang.yaml"
    got = run.invoke(app, ["export", str(res), "--engine", "sglang", "-o", str(out)])
    assert got.exit_code == 0, got.output
    text = out.read_text()
    assert "speculative-eagle-topk: 4" in text and "speculative-num-draft-tokens: 8" in text and "speculative-num-steps: 3" in text
    back = tree_setting(read_serving_config(out))
    assert back is not None and back[0] == "steps=3,topk=4,tokens=8"
    # a grid tree by name, for TensorRT-LLM's dynamic tree
    trt = tmp_path / "extra.yaml"
    got = run.invoke(app, ["export", str(res), "--engine", "trtllm", "--tree", "steps=2,topk=2,tokens=4", "-o", str(trt)])
    assert got.exit_code == 0, got.output
    back = tree_setting(read_serving_config(trt))
    assert back is not None and back[0] == "steps=2,topk=2,tokens=4"
    # --k asks for the chain
    got = run.invoke(app, ["export", str(res), "--engine", "sglang", "--k", "2"])
    assert got.exit_code == 0 and "speculative-eagle-topk: 1" in got.output
    for args, words in ((["--engine", "vllm", "--tree", "steps=3,topk=4,tokens=8"], "verifies chains"),
                        (["--engine", "sglang", "--tree", "steps=3,topk=3,tokens=9"], "did not estimate"),
                        (["--engine", "sglang", "--tree", "steps=3,topk=4,tokens=8", "--k", "2"], "different things")):
        bad = run.invoke(app, ["export", str(res), *args])
        assert bad.exit_code == 2 and words in bad.output, bad.output


def test_export_static_tree_to_trtllm(tiny_pair: dict[str, Path], pf: Path, tmp_path: Path) -> None:
    from specprobe.settings.serving import read_serving_config, tree_setting

    r = run_diagnose(_cfg(tiny_pair, pf, str(tiny_pair["twin"]), tree="[[0],[1],[0,0]]", engine="trtllm", sampling=SamplingFlags(temperature=0.0)))
    res = tmp_path / "r.json"
    res.write_text(r.to_json())
    bad = CliRunner().invoke(app, ["export", str(res), "--engine", "sglang"])
    assert bad.exit_code == 2 and "dynamically" in bad.output
    out = tmp_path / "extra.yaml"
    got = CliRunner().invoke(app, ["export", str(res), "--engine", "trtllm", "-o", str(out)])
    assert got.exit_code == 0, got.output
    back = tree_setting(read_serving_config(out))
    assert back is not None and back[0] == "[[0],[1],[0,0]]"


def test_reports_show_the_tree(tiny_pair: dict[str, Path], pf: Path, tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from specprobe.report.console import render
    from specprobe.report.csv_out import write_csv
    from specprobe.report.html import render_html
    from specprobe.report.markdown import render_markdown

    r = run_diagnose(_cfg(tiny_pair, pf, "self:layers=1", sampling=SamplingFlags(temperature=1.0)))
    assert r.trees is not None and r.trees.tree is not None
    nodes = r.trees.tree.nodes
    assert nodes and all(0.0 <= (n.accepted or 0.0) <= (n.verified or 0.0) + 1e-9 for n in nodes)
    # the depth-1 nodes' acceptance adds up to depth 1's
    assert sum(n.accepted or 0.0 for n in nodes if len(n.path) == 1) == pytest.approx(r.trees.tree.depth_accept[0], abs=1e-5)
    buf = io.StringIO()
    render(r, Console(file=buf, width=80, color_system=None))
    text = buf.getvalue()
    assert "draft tree steps=3,topk=4,tokens=8" in text and "fastest draft trees and chains" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    md = render_markdown(r)
    assert "#### Draft tree `steps=3,topk=4,tokens=8`" in md and "| depth | accepted | rank 1 |" in md
    html = render_html(r)
    assert 'id="chart-tree"' in html and "Fastest draft trees and chains" in html
    names = {p.name for p in write_csv(r, tmp_path / "csv")}
    assert {"trees.csv", "tree_depth.csv"} <= names


def test_sweep_estimates_each_drafters_tree_as_diagnose_does(tiny_pair: dict[str, Path], pf: Path) -> None:
    from specprobe.probe.sweep import run_sweep

    cfg = _cfg(tiny_pair, pf, "self:layers=1", sampling=SamplingFlags(temperature=1.0))
    drafters = ["self:layers=1", str(tiny_pair["twin"])]
    sw = run_sweep(cfg, drafters)
    for spec, row, r in zip(drafters, sw.report.rows, sw.results, strict=True):
        alone = run_diagnose(_cfg(tiny_pair, pf, spec, sampling=SamplingFlags(temperature=1.0)))
        assert r.trees is not None and alone.trees is not None and alone.trees.tree is not None
        assert row.tree_tau_tokens == pytest.approx(alone.trees.tree.tau_tokens, abs=1e-6)
        assert row.tree_best is not None


def test_best_tree_by_batch_size(tiny_pair: dict[str, Path], pf: Path) -> None:
    r = run_diagnose(_cfg(tiny_pair, pf, "self:layers=1", sampling=SamplingFlags(temperature=1.0), cost_ratio=None, verify_factor=None, batch_sizes=[1, 4]))
    assert r.trees is not None and r.cost is not None
    by = {b.batch_size: b for b in r.trees.by_batch}
    assert set(by) == {1, 4}
    for b in by.values():
        assert b.best_chain is not None and b.best_chain.topk == 1
        assert b.best_tree is None or b.best_tree.topk > 1
    # the run's own batch size prices its rows as the grid does
    assert by[4].best_chain == r.trees.best_chain
