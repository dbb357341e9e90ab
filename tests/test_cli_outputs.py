"""The output contract (what a new user hits): serving-config sampling applied by check,
every output path checked before any model loads or any file is written, the umask
respected, check never writing over a diagnose result, every write announced."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app

runner = CliRunner()
DATA = Path(__file__).parent / "data"
V1 = DATA / "results" / "v1" / "diagnose.json"


def run(*args: str):
    return runner.invoke(app, list(args))


def text(res) -> str:
    return " ".join(res.output.split())


def _sglang(tmp_path: Path, tiny_pair, temperature: float = 1.0) -> Path:
    p = tmp_path / "sg.yaml"
    p.write_text(
        f"model-path: {tiny_pair['target']}\nspeculative-algorithm: STANDALONE\nspeculative-draft-model-path: {tiny_pair['twin']}\n"
        f"speculative-num-steps: 4\npreferred-sampling-params: '{{\"temperature\": {temperature}, \"top_p\": 0.95}}'\n"
    )
    return p


# ----------------------------------------------------------------------------- item 1
def test_check_applies_the_serving_configs_sampling_and_shows_drafter_and_k(tiny_pair, tmp_path: Path) -> None:
    t, d = str(tiny_pair["target"]), str(tiny_pair["twin"])
    sg = _sglang(tmp_path, tiny_pair)
    res = run("check", t, d, "--serving-config", str(sg), "--json", str(tmp_path / "a.json"))
    assert res.exit_code == 0, res.output  # the server is self-consistent: T = 1.0 on both sides
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["sampling"]["target"]["temperature"] == 1.0 and data["sampling"]["target"]["top_p"] == 0.95
    assert data["sampling"]["sources"]["target.temperature"] == "sg.yaml" and data["sampling"]["draft"]["top_p"] == 0.95
    assert "K = 4" in text(res) and f"drafter {d}" in text(res)
    # probing at 0.7 against a server at 1.0 is caught, naming both places
    res = run("check", t, d, "--temperature", "0.7", "--serving-config", str(sg), "--json", str(tmp_path / "b.json"))
    assert res.exit_code == 1, res.output
    data = json.loads((tmp_path / "b.json").read_text())
    sp019 = _finding(data, "SP019")
    assert "temperature differs: command line 0.7, sg.yaml 1" in sp019["evidence"]
    assert data["sampling"]["sources"]["target.temperature"] == "--temperature" and data["sampling"]["sources"]["target.top_p"] == "sg.yaml"


def _finding(data: dict, rule_id: str) -> dict:
    found = [f for f in data["findings"] if f["rule_id"] == rule_id]
    assert found, f"{rule_id} not in {[f['rule_id'] for f in data['findings']]}"
    return found[0]


def test_sp012_names_where_each_temperature_came_from(tiny_pair, tmp_path: Path) -> None:
    # sampled drafts: the drafter's temperature is the one it drafts at (greedy drafting ignores it, SP030)
    t, d = str(tiny_pair["target"]), str(tiny_pair["twin"])
    res = run("check", t, d, "--temperature", "0.7", "--draft-temperature", "1.2", "--draft-sampling", "probabilistic", "--json", str(tmp_path / "a.json"))
    assert res.exit_code == 1, res.output
    sp012 = _finding(json.loads((tmp_path / "a.json").read_text()), "SP012")
    assert "temperature 1.2 while the target samples at 0.7" in sp012["message"]
    assert "target temperature from --temperature, drafter from --draft-temperature" in sp012["evidence"]
    cfg = tmp_path / "probe.yaml"
    cfg.write_text(f"target: {t}\ndrafter: {d}\ntemperature: 0.7\ndraft_temperature: 1.2\ndraft_sampling: probabilistic\n")
    res = run("check", "--config", str(cfg), "--json", str(tmp_path / "b.json"))
    assert res.exit_code == 1, res.output
    sp012 = _finding(json.loads((tmp_path / "b.json").read_text()), "SP012")
    assert "target temperature from probe.yaml, drafter from probe.yaml" in sp012["evidence"]


# ----------------------------------------------------------------------------- items 2, 3, 5: before anything loads or is written
def _bad_path(kind: str) -> str:
    if not Path("/proc").is_dir():
        pytest.skip("needs /proc (a folder no one can create files in)")
    return "/proc/specprobe-test/x.out" if kind == "file" else "/proc/specprobe-test-dir"


# (command, its output flags with file/dir kind, arguments that would load models)
OUTPUTS = {
    "check": ({"--json": "file"}, ["T", "D"]),
    "diagnose": ({"--json": "file", "--csv": "dir", "--html": "file", "--junit": "file", "--markdown": "file"}, ["T", "D"]),
    "simulate": ({"--json": "file", "--csv": "dir", "--html": "file", "--junit": "file", "--markdown": "file"}, ["T", "D"]),
    "demo": ({"--json": "file"}, []),
    "report": ({"--csv": "dir", "--html": "file", "--junit": "file", "--markdown": "file"}, [str(V1)]),
    "compare": ({"--json": "file", "--csv": "dir", "--html": "file", "--junit": "file", "--markdown": "file"}, [str(V1), str(V1)]),
}
CASES = [(cmd, flag, kind) for cmd, (flags, _) in OUTPUTS.items() for flag, kind in flags.items()]


@pytest.mark.parametrize(("command", "flag", "kind"), CASES, ids=[f"{c}{f}" for c, f, _ in CASES])
def test_every_output_of_every_command_is_checked_before_any_model_loads(no_models, tiny_pair, tmp_path: Path, command: str, flag: str, kind: str) -> None:
    flags, args = OUTPUTS[command]
    args = [str(tiny_pair["target"]) if a == "T" else str(tiny_pair["twin"]) if a == "D" else a for a in args]
    # the other outputs are fine and listed first: none of them may be written
    good = [x for f, k in flags.items() if f != flag for x in (f, str(tmp_path / f"ok{f.replace('-', '_')}{'' if k == 'dir' else '.out'}"))]
    res = run(command, *args, *good, flag, _bad_path(kind))
    assert res.exit_code == 2, res.output
    assert f"{flag} /proc/specprobe-test" in text(res), res.output
    assert list(tmp_path.iterdir()) == []


def test_an_empty_output_path_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    """`report R.json --junit junit.xml --markdown "$GITHUB_STEP_SUMMARY"` outside CI."""
    junit = tmp_path / "junit.xml"
    res = run("report", str(V1), "--junit", str(junit), "--markdown", "")
    assert res.exit_code == 2 and "--markdown was given an empty path" in text(res)
    assert not junit.exists()


def test_dtype_and_device_are_refused_before_the_target_loads(no_models, tiny_pair) -> None:
    t, d = str(tiny_pair["target"]), str(tiny_pair["twin"])
    res = run("diagnose", t, d, "--dtype", "float8")
    assert res.exit_code == 2 and "--dtype 'float8' is not one of auto, float32, bfloat16, float16" in text(res)
    res = run("simulate", t, d, "--device", "tpu")
    assert res.exit_code == 2 and "--device 'tpu' is not supported" in text(res)
    res = run("demo", "--dtype", "float8")
    assert res.exit_code == 2 and "--dtype 'float8'" in text(res)


# ----------------------------------------------------------------------------- item 6
def test_outputs_respect_the_umask(tmp_path: Path) -> None:
    from specprobe.core.files import write_text_atomic
    from specprobe.report.load import load_result

    old = os.umask(0o022)
    try:
        p = write_text_atomic(tmp_path / "new" / "r.json", "{}\n")
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
        assert stat.S_IMODE(p.parent.stat().st_mode) == 0o755
        os.chmod(p, 0o664)  # an existing file keeps the mode it had
        write_text_atomic(p, "{}\n")
        assert stat.S_IMODE(p.stat().st_mode) == 0o664
        res = run("report", str(V1), "-q", "--csv", str(tmp_path / "csv"), "--html", str(tmp_path / "r.html"))
        assert res.exit_code == 0, res.output
        assert stat.S_IMODE((tmp_path / "csv").stat().st_mode) == 0o755
        assert stat.S_IMODE((tmp_path / "r.html").stat().st_mode) == 0o644
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o644 for f in (tmp_path / "csv").iterdir())
        assert load_result(V1)  # the fixture itself is readable
    finally:
        os.umask(old)


# ----------------------------------------------------------------------------- item 7
def test_check_never_writes_over_the_configs_diagnose_output(tiny_pair, tmp_path: Path) -> None:
    result = tmp_path / "out" / "candidate.json"
    result.parent.mkdir()
    shutil.copy(V1, result)
    before = result.read_bytes()
    cfg = tmp_path / "probe.yaml"
    cfg.write_text(f"target: {tiny_pair['target']}\ndrafter: {tiny_pair['twin']}\noutputs:\n  json: out/candidate.json\n")
    res = run("check", "--config", str(cfg))
    assert res.exit_code == 0, res.output
    assert result.read_bytes() == before and "wrote" not in res.output
    res = run("check", "--config", str(cfg), "--json", str(tmp_path / "check.json"))
    assert res.exit_code == 0 and json.loads((tmp_path / "check.json").read_text())["command"] == "check"


# ----------------------------------------------------------------------------- item 8
def test_compare_json_says_where_it_wrote(tmp_path: Path) -> None:
    out = tmp_path / "cmp.json"
    res = run("compare", str(V1), str(V1), "--json", str(out), "--fail-on", "never")
    assert res.exit_code == 0, res.output
    assert out.is_file() and f"wrote {out}" in text(res)


def test_a_written_path_is_one_unbroken_line_however_long(tmp_path: Path) -> None:
    """A path longer than the console is printed whole on one line (the terminal wraps
    it, a log keeps it greppable): rich would break it mid-word. On a 2-digit pytest
    directory the line above fitted and on a 3-digit one it broke ("cmp.jso n")."""
    out = tmp_path / ("a-directory-name-long-enough-to-pass-any-console-width-" * 3) / "cmp.json"
    out.parent.mkdir()
    res = run("compare", str(V1), str(V1), "--json", str(out), "--fail-on", "never")
    assert res.exit_code == 0, res.output
    assert out.is_file() and f"wrote {out}\n" in res.output
