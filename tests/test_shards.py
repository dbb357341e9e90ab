"""Sharded runs: `--shard 0/3,1/3,2/3` + `merge` equals the whole run (every
accumulator within float tolerance, the same rows, drill-down and findings); merge
refuses parts of other runs and missing or repeated shards (one line, exit 2); a rerun
reuses a finished shard's part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ConfigError, InputError
from specprobe.probe.shards import load_part, owns
from specprobe.settings.values import Shard, parse_shard
from tests.helpers.same import REL_OTHER_BATCHING, differences

runner = CliRunner()


def _args(tiny_pair: dict[str, Path], prompts: Path) -> list[str]:
    return [
        "diagnose", str(tiny_pair["target"]), "self:layers=1", "--prompts", str(prompts), "--max-new-tokens", "10", "--batch-size", "2",
        "--k-max", "3", "--temperature", "1.0", "--cost-ratio", "0.1", "--verify-factor", "1.0", "--device", "cpu",
    ]


@pytest.fixture(scope="module")
def sharded(tiny_pair: dict[str, Path], session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The whole run's result and its three parts, all through the CLI."""
    from tests.helpers.tiny import prompts_file

    d = tmp_path_factory.mktemp("shards")
    pf = prompts_file(d / "prompts.jsonl", n=7)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECPROBE_CACHE_DIR", str(session_cache))
        whole = runner.invoke(app, [*_args(tiny_pair, pf), "--json", str(d / "whole.json")])
        assert whole.exit_code in (0, 1), whole.output
        for i in range(3):
            r = runner.invoke(app, [*_args(tiny_pair, pf), "--shard", f"{i}/3", "--json", str(d / f"part{i}.json")])
            assert r.exit_code == 0, r.output
    return {"dir": d, "prompts": pf, "whole": json.loads((d / "whole.json").read_text()), "parts": [d / f"part{i}.json" for i in range(3)]}


def test_three_shards_merged_equal_the_whole_run(sharded: dict[str, Any]) -> None:
    d = sharded["dir"]
    r = runner.invoke(app, ["merge", *map(str, reversed(sharded["parts"])), "--json", str(d / "merged.json")])
    assert r.exit_code in (0, 1), r.output
    merged, whole = json.loads((d / "merged.json").read_text()), sharded["whole"]
    assert differences(whole, merged, rel=REL_OTHER_BATCHING) == []
    assert merged["metrics"]["num_prompts"] == 7 and merged["positions"]["prompt_id"] == whole["positions"]["prompt_id"]
    assert [f["rule_id"] for f in merged["findings"]] == [f["rule_id"] for f in whole["findings"]]
    # each shard scored only its own batches: together every prompt, once
    counts = [load_part(p)["accumulator"]["num_prompts"] for p in sharded["parts"]]
    assert sorted(counts) == [2, 2, 3] and sum(counts) == 7


def test_merge_refuses_parts_of_another_run_or_a_missing_or_repeated_shard(sharded: dict[str, Any], tmp_path: Path) -> None:
    p0, p1, p2 = sharded["parts"]
    other = json.loads(p2.read_text())
    other["identity"]["config"]["max_new_tokens"] = 11
    (tmp_path / "other.json").write_text(json.dumps(other))
    cases = {
        "other run": ([p0, p1, tmp_path / "other.json"], "from another run"),
        "missing": ([p0, p2], "shard(s) 1/3 missing"),
        "twice": ([p0, p1, p1, p2], "shard 1/3 is given twice"),
        "not a part": ([p0, tmp_path / "nope.json"], "does not exist"),
        "a directory": ([p0, tmp_path], "is a directory"),
    }
    for name, (paths, message) in cases.items():
        r = runner.invoke(app, ["merge", *map(str, paths), "--json", str(tmp_path / "m.json")])
        assert r.exit_code == 2, name
        assert message in r.output and len(r.output.strip().splitlines()) == 1, (name, r.output)
    assert not (tmp_path / "m.json").exists()


def test_a_rerun_reuses_the_finished_shard(sharded: dict[str, Any], tiny_pair: dict[str, Path], session_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import specprobe.probe.diagnose as diagnose

    def no_scoring(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a finished shard was scored again")

    monkeypatch.setattr(diagnose, "score", no_scoring)
    r = runner.invoke(app, [*_args(tiny_pair, sharded["prompts"]), "--shard", "1/3", "--json", str(tmp_path / "again.json")])
    assert r.exit_code == 0, r.output
    again, first = load_part(tmp_path / "again.json"), load_part(sharded["parts"][1])
    assert differences(again["accumulator"], first["accumulator"]) == []
    assert [it["id"] for it in again["items"]] == [it["id"] for it in first["items"]]


def test_shard_flag_errors(sharded: dict[str, Any], tiny_pair: dict[str, Path], tmp_path: Path) -> None:
    assert parse_shard("2/5") == Shard(2, 5)
    for bad in ("3/3", "1", "-1/2", "a/b", "0/0"):
        with pytest.raises(ConfigError, match="--shard"):
            parse_shard(bad)
    r = runner.invoke(app, [*_args(tiny_pair, sharded["prompts"]), "--shard", "0/2"])
    assert r.exit_code == 2 and "--shard needs --json" in r.output
    r = runner.invoke(app, [*_args(tiny_pair, sharded["prompts"]), "--shard", "0/2", "--json", str(tmp_path / "p.json"), "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 2 and "--html" in r.output
    # whole batches: batch b of size 2 belongs to shard b % 3
    assert [i for i in range(12) if owns(i, 2, Shard(1, 3))] == [2, 3, 8, 9]
    with pytest.raises(InputError, match="not a specprobe part"):
        (tmp_path / "x.json").write_text(json.dumps(sharded["whole"]))
        load_part(tmp_path / "x.json")


def test_device_map_loads_through_accelerate_and_hooks_read_the_layers(sharded: dict[str, Any], tiny_pair: dict[str, Path], tmp_path: Path) -> None:
    """--device-map / --max-memory reach accelerate (here everything on the CPU), and the
    self-draft's hooks read the same layer: the result equals the ordinary load's."""
    from specprobe.core.errors import ConfigError as CE
    from specprobe.models.loader import load_model
    from specprobe.settings.values import parse_max_memory

    assert parse_max_memory("0=70GiB, 1=70GiB,cpu=8GiB") == {0: "70GiB", 1: "70GiB", "cpu": "8GiB"}
    with pytest.raises(CE, match="DEVICE=SIZE"):
        parse_max_memory("gpu0:70")
    import transformers

    seen: dict[str, Any] = {}
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*a: Any, **k: Any) -> Any:
        seen.update(k)
        return real(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
        m = load_model(str(tiny_pair["target"]), "cpu", "float32", device_map="auto", max_memory={"cpu": "2GiB"})
    assert seen["device_map"] == "auto" and seen["max_memory"] in ({"cpu": "2GiB"}, {"cpu": 2 << 30}) and m.device == "cpu"
    r = runner.invoke(app, [*_args(tiny_pair, sharded["prompts"]), "--device-map", "cpu", "--max-memory", "cpu=2GiB", "--json", str(tmp_path / "spread.json")])
    assert r.exit_code in (0, 1), r.output
    spread = json.loads((tmp_path / "spread.json").read_text())
    assert spread["config"]["device_map"] == "cpu"
    assert differences(sharded["whole"]["by_domain"], spread["by_domain"], rel=1e-6) == []
    r = runner.invoke(app, [*_args(tiny_pair, sharded["prompts"]), "--max-memory", "lots"])
    assert r.exit_code == 2 and "--max-memory" in r.output


def test_sampled_second_turns_are_batched_and_seeded_as_in_the_whole_run(tiny_pair: dict[str, Path], session_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spec-Bench questions with two turns, sampled at T = 1: the second turns follow the
    target's own first answers; each is batched with its first turn's batch and seeded by
    it, so three shards merged give the whole run's second turns too."""
    qs = [{"question_id": 81 + i, "category": ["writing", "math", "coding"][i % 3], "turns": [f"Question {i} about {w}?"] + ([f"Now say more about {w}."] if i % 4 != 1 else [])} for i, w in enumerate(("cats", "primes", "sorting", "rivers", "poems", "graphs", "tides"))]
    pf = tmp_path / "question.jsonl"
    pf.write_text("".join(json.dumps(q) + "\n" for q in qs))
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(session_cache))
    whole = runner.invoke(app, [*_args(tiny_pair, pf), "--json", str(tmp_path / "whole.json")])
    assert whole.exit_code in (0, 1), whole.output
    parts = []
    for i in range(3):
        r = runner.invoke(app, [*_args(tiny_pair, pf), "--shard", f"{i}/3", "--json", str(tmp_path / f"part{i}.json")])
        assert r.exit_code == 0, r.output
        parts.append(str(tmp_path / f"part{i}.json"))
    r = runner.invoke(app, ["merge", *parts, "--json", str(tmp_path / "merged.json")])
    assert r.exit_code in (0, 1), r.output
    w, m = (json.loads((tmp_path / f).read_text()) for f in ("whole.json", "merged.json"))
    second = [p for p in w["positions"]["prompt_id"] if str(p).endswith("#2")]
    assert len(set(second)) == 5  # every two-turn question was asked its second turn
    assert sorted(m["positions"]["prompt_id"]) == sorted(w["positions"]["prompt_id"])
    assert differences(w["metrics"], m["metrics"], rel=REL_OTHER_BATCHING) == []
