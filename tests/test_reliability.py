"""The reliability table (docs/reliability.md), one test per row: every bad input and
fault that has been tried, with the exit code and the stable part of the message it
must give. A row's id (M01, P06, …) is in its test's name or parametrize id, and
`test_every_row_of_the_table_has_a_test` keeps the table and this file in step.

Heavy rows share one loaded tiny model; the 2 GB prompts file is sparse (no 2 GB is
written); signals are real (`os.kill`) but sent from inside the run, so nothing depends
on timing."""

from __future__ import annotations

import gzip
import http.server
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
V1_RESULTS = ROOT / "tests" / "data" / "results" / "v1"
runner = CliRunner()


# ----------------------------------------------------------------------------- helpers
def one_line_error(res: Any, code: int = 2) -> str:
    """The single 'error:' line of a failed command: exit `code`, no traceback."""
    out = res.output
    assert res.exit_code == code, out
    assert "Traceback" not in out, out
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, out
    return lines[0]


def cli(*args: str, **kw: Any) -> Any:
    return runner.invoke(app, [str(a) for a in args], **kw)


def run_unprivileged(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`specprobe ARGS` in a process that permissions bind: root reads anything, so as
    root the process runs without the capabilities that override file modes."""
    env = {**os.environ, "SPECPROBE_CACHE_DIR": str(cwd / "cache"), "COLUMNS": "200"}
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: a mode-000 file is readable")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    return subprocess.run([*prefix, sys.executable, "-m", "specprobe.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def subprocess_error(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def shows_nan(text: str) -> bool:
    """A nan or inf printed as a value (Python's spelling), not "NaN/+inf" in a message."""
    return re.search(r"(?<![\w/+])-?(nan|inf)(?![\w/])", text) is not None


def bytes_read() -> int:
    """Bytes this process has read through read(2) so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.fixture
def target_copy(tiny_pair: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_pair["target"], tmp_path / "target"))


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    from tests.helpers.tiny import prompts_file

    return prompts_file(tmp_path / "prompts.jsonl")


# ============================================================================= M: model files
def test_M01_model_path_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = one_line_error(cli("check", tmp_path / "nope", "self"))
    assert "does not exist" in line
    # diagnose and simulate refuse them before any model loads: a drafter, a head's path
    # after its prefix (check reads only configs and tokenizers, and stops at the same line)
    import specprobe.models.loader as loader

    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a model was loaded before the paths were checked")

    import specprobe.probe.diagnose as diagnose  # it loads the pair: patched where it looks them up

    for mod in (loader, diagnose):
        monkeypatch.setattr(mod, "load_model", boom)
        monkeypatch.setattr(mod, "load_info", boom)
    for cmd in ("diagnose", "simulate"):
        for drafter in (str(tmp_path / "gone"), f"eagle3:{tmp_path / 'gone'}", f"medusa:{tmp_path / 'gone'}"):
            res = cli(cmd, "smollm2", drafter)
            line = one_line_error(res)
            assert "loading" not in res.output, (cmd, drafter, res.output)
            assert line.startswith(f"error: model path {tmp_path / 'gone'} does not exist"), (cmd, drafter, line)


@pytest.mark.parametrize(
    ("row", "damage", "needle"),
    [
        pytest.param("M02", lambda d: (d / "config.json").unlink(), "is not a transformers checkpoint (no config.json)", id="M02"),
        pytest.param("M03", lambda d: (d / "config.json").write_text('{"model_type": "llama", '), "cannot read config.json", id="M03"),
        pytest.param("M04", lambda d: (d / "config.json").write_text(""), "cannot read config.json", id="M04"),
        pytest.param("M05", lambda d: [p.unlink() for p in d.glob("tokenizer*")], "cannot load the tokenizer", id="M05"),
    ],
)
def test_checkpoint_metadata_damage(target_copy: Path, row: str, damage: Callable[[Path], Any], needle: str) -> None:
    damage(target_copy)
    assert needle in one_line_error(cli("check", target_copy, "self"))


def test_M06_model_file_unreadable(target_copy: Path, tmp_path: Path) -> None:
    (target_copy / "config.json").chmod(0o000)
    line = subprocess_error(run_unprivileged(["check", str(target_copy), "self"], tmp_path))
    assert "cannot read config.json" in line and "Permission denied" in line


def _lfs_pointer(path: Path) -> None:
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 1024\n")


@pytest.mark.parametrize(
    ("damage",),
    [
        pytest.param(lambda p: p.write_bytes(b""), id="M07-empty"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 3]), id="M08-truncated"),
        pytest.param(_lfs_pointer, id="M09-wrong-kind"),
    ],
)
def test_weights_damage(target_copy: Path, prompts: Path, damage: Callable[[Path], Any]) -> None:
    damage(target_copy / "model.safetensors")
    res = cli("diagnose", target_copy, "self", "--prompts", prompts, "--max-new-tokens", "4", "--cost-ratio", "0.1", "--verify-factor", "1")
    assert "cannot load the weights in" in one_line_error(res)


def _tiny_gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_token_list(["<a>", "<b>", "c"])
    w.add_tensor("token_embd.weight", np.random.default_rng(0).standard_normal((3, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    ("name", "make", "needle"),
    [
        pytest.param("m.gguf", lambda p: p.write_bytes(b""), "is not a valid GGUF file (bad magic bytes", id="M10-empty-gguf"),
        pytest.param("m.gguf", lambda p: p.write_bytes(_tiny_gguf(p).read_bytes()[:200]), "is corrupt or truncated", id="M11-truncated-gguf"),
        pytest.param("m.gguf", lambda p: p.write_bytes(b"PK\x03\x04" + bytes(100)), "is not a valid GGUF file (bad magic bytes", id="M12-zip-as-gguf"),
        pytest.param("weights.bin", lambda p: p.write_bytes(b"\x80\x02}q\x00."), "is a file but not a GGUF model", id="M13-not-a-model"),
    ],
)
def test_gguf_damage(tmp_path: Path, name: str, make: Callable[[Path], Any], needle: str) -> None:
    path = tmp_path / name
    make(path)
    assert needle in one_line_error(cli("check", path, "self"))


def _head(tiny_pair: dict[str, Path], tmp_path: Path) -> Path:
    from tests.helpers import heads as hh

    return hh.eagle3_speculators(tmp_path / "head", tiny_pair["target"])


def test_M14_head_checkpoint_with_a_missing_tensor(tiny_pair: dict[str, Path], tmp_path: Path, prompts: Path) -> None:
    from safetensors.torch import load_file, save_file

    head = _head(tiny_pair, tmp_path)
    sd = load_file(str(head / "model.safetensors"))
    del sd["layers.0.mlp.down_proj.weight"]
    save_file(sd, str(head / "model.safetensors"))
    res = cli("diagnose", tiny_pair["target"], head, "--prompts", prompts, "--max-new-tokens", "4", "--cost-ratio", "0.1", "--verify-factor", "1", "--force")
    line = one_line_error(res)
    assert "layers.0.mlp.down_proj.weight" in line and "missing" in line


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        pytest.param(lambda h: (h / "model.safetensors").write_bytes((h / "model.safetensors").read_bytes()[:300]), "corrupt or truncated", id="M15-truncated-head"),
        pytest.param(lambda h: (h / "config.json").write_text("{'speculators_model_type': 'eagle3'}"), "cannot read", id="M16-head-config-bad-json"),
    ],
)
def test_head_damage(tiny_pair: dict[str, Path], tmp_path: Path, damage: Callable[[Path], Any], needle: str) -> None:
    head = _head(tiny_pair, tmp_path)
    damage(head)
    assert needle in one_line_error(cli("check", tiny_pair["target"], head))


# ============================================================================= P: prompt files
def _diagnose_prompts(tiny_pair: dict[str, Path], path: Path) -> str:
    # prompts are read before any model loads: a bad file costs nothing
    return one_line_error(cli("diagnose", tiny_pair["target"], "self", "--prompts", path, "--max-new-tokens", "4"))


def _lines(n: int, start: int = 0) -> str:
    return "".join(json.dumps({"id": f"q{i}", "prompt": f"w{i % 200} w{(i * 7) % 200}", "domain": "chat"}) + "\n" for i in range(start, start + n))


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        pytest.param(None, "does not exist", id="P01-missing"),
        pytest.param(b"", "empty prompt set", id="P02-empty"),
        pytest.param(b"\n  \n\t\n", "empty prompt set", id="P03-blank-lines"),
        pytest.param(b'{"prompt": "w1"}\n' + bytes(range(256)) * 4, ":2: binary data (NUL byte at offset", id="P04-binary"),
        pytest.param("dir", "is a directory", id="P05-directory"),
        pytest.param(b'{"prompt": "w1"}\n{"prompt": "caf\xe9"}\n', ":2: not UTF-8 (byte 0xe9 at offset", id="P08-latin1"),
        pytest.param('{"prompt": "w1"}\n'.encode("utf-16"), "UTF-16 text, not UTF-8", id="P09-utf16"),
        pytest.param(b'{"id": "a", "prompt": "w1"}\n{"id": "b", "prompt": "w2"}\n{"id": "a", "prompt": "w3"}\n', ":3: duplicate id 'a' (first on line 1)", id="P10-duplicate-ids"),
        pytest.param(gzip.compress(b'{"prompt": "w1"}\n'), "is a gzip-compressed file", id="P11-gzip"),
        pytest.param(b'[{"prompt": "w1"}, {"prompt": "w2"}]\n', "is one JSON array, not JSON lines", id="P12-json-array"),
        pytest.param(b'{"prompt": "w1"}\n["w2"]\n', ":2: not a JSON object (got list)", id="P13-not-an-object"),
        pytest.param(b'{"question_id": 1, "turns": "w1"}\n', ":1: `turns` must be a list of non-empty strings", id="P14-turns-wrong-type"),
        pytest.param(b'{"prompt": "w1"}\n{"prompt": "w2"\n', ":2: not valid JSON", id="P15-truncated-line"),
        pytest.param(b'{"prompt": "w1"}\n{"prompt": "w2", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", ":2: nested too deeply to read", id="P17-deep-nesting"),
    ],
)
def test_prompt_files(tiny_pair: dict[str, Path], tmp_path: Path, content: bytes | str | None, needle: str) -> None:
    path = tmp_path / "prompts.jsonl"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    assert needle in _diagnose_prompts(tiny_pair, path)


def test_P06_two_gigabytes_sparse_with_a_bad_line_far_in(tmp_path: Path) -> None:
    """A 2 GiB file (sparse: nothing is written to disk) of 1 MiB of good lines, then a
    hole of NUL bytes to 2 GiB and a last line: refused at the first bad byte, having
    read a few MiB, not 2 GiB."""
    from specprobe.core.errors import InputError
    from specprobe.prompts import load_prompts

    good = _lines(12_000).encode()
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as fh:
        fh.write(good)
        fh.seek(2 * 1024**3 - 100)
        fh.write(b'{"prompt": "the last line"}\n')
    assert path.stat().st_size >= 2 * 1024**3 - 100
    before = bytes_read()
    with pytest.raises(InputError) as e:
        load_prompts(path)
    assert bytes_read() - before < 64 * 1024**2
    first_bad = good.count(b"\n") + 1
    assert f":{first_bad}: binary data (NUL byte at offset {len(good)})" in e.value.one_line()


def test_P07_a_bad_line_after_megabytes_of_good_ones_streamed(tmp_path: Path) -> None:
    """~8 MB of good lines then one bad line: the error names the exact line; a bad line
    in the middle stops the reader there (it does not read the rest of the file)."""
    from specprobe.core.errors import InputError
    from specprobe.prompts import load_prompts

    n = 100_000
    path = tmp_path / "big.jsonl"
    path.write_text(_lines(n) + '{"prompt": "w1", }\n')
    with pytest.raises(InputError, match=rf":{n + 1}: not valid JSON"):
        load_prompts(path)
    mid = tmp_path / "mid.jsonl"
    mid.write_text(_lines(1000) + "not json\n" + _lines(n, start=1000))
    before = bytes_read()
    with pytest.raises(InputError, match=":1001: not valid JSON"):
        load_prompts(mid)
    assert bytes_read() - before < mid.stat().st_size // 2


def test_P16_prompts_file_unreadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Permission denied (simulated: the tests may run as root, who reads anything)."""
    from specprobe.core.errors import InputError
    from specprobe.prompts import load_prompts

    path = tmp_path / "p.jsonl"
    path.write_text(_lines(3))
    real_open = Path.open

    def deny(self: Path, *a: Any, **kw: Any) -> Any:
        if self.name == "p.jsonl":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *a, **kw)

    monkeypatch.setattr(Path, "open", deny)
    monkeypatch.setattr(Path, "read_bytes", lambda self: deny(self).read())
    with pytest.raises(InputError, match="cannot be read: Permission denied"):
        load_prompts(path)


# ============================================================================= R: rules files
_RULE = {"id": "SP900", "name": "my-rule", "severity": "warning", "when": "accept_prob_mean < 0.5", "diagnosis": "low", "remedy": "fix it"}

_BOMB = "".join(
    f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 9 if i else ['"lol"'] * 9) + "]\n" for i in range(9)
)  # 9 levels of 9 aliases: 9^9 ≈ 387 million leaves once expanded


def _rules_yaml(rules: list[dict[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump({"rules": rules}, sort_keys=False)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param(_rules_yaml([{**_RULE, "treshold": 3}]), "rule SP900 has unknown key(s) treshold", id="R01-unknown-key"),
        pytest.param(_rules_yaml([{**_RULE, "severity": 3}]), "rule SP900 has severity 3", id="R02-bad-type"),
        pytest.param(_rules_yaml([{**_RULE, "when": "accept_prob_mean <"}]), "rule SP900 has a bad condition", id="R03-bad-condition"),
        pytest.param(_rules_yaml([{**_RULE, "when": "acceptance < 0.5"}]), "rule SP900 names unknown metric 'acceptance'", id="R04-unknown-metric"),
        pytest.param(_rules_yaml([_RULE, {**_RULE, "name": "again"}]), "duplicate rule id SP900", id="R05-duplicate-id"),
        pytest.param(_BOMB + "rules: *i\n", "aliases", id="R06-billion-laughs"),
        pytest.param(_BOMB + "rules:\n  - id: SP900\n    name: x\n    severity: error\n    diagnosis: d\n    remedy: r\n    when: *i\n", "aliases", id="R07-bomb-inside-a-rule"),
        pytest.param("rules:\n  - id: SP900\n\tname: x\n", "is not valid YAML", id="R08-not-yaml"),
        pytest.param("rule:\n  - id: SP900\n", "has no 'rules:' list", id="R09-no-rules-list"),
        pytest.param("[" * 5000 + "]" * 5000, "rules file", id="R10-deep-nesting"),
        pytest.param(_rules_yaml([{**_RULE, "when": ["accept_prob_mean < 0.5"]}]), "rule SP900", id="R11-when-is-a-list"),
        pytest.param(b"rules:\n  - id: SP900\n    name: caf\xe9\n", "not UTF-8", id="R12-not-utf8"),
    ],
)
def test_rules_files(tmp_path: Path, text: str | bytes, needle: str) -> None:
    path = tmp_path / "rules.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert needle in one_line_error(cli("rules", "list", "--rules", path))


def test_R06_bomb_is_refused_by_counting_not_expanding(tmp_path: Path) -> None:
    """The refusal comes from counting the alias graph, not from expanding it."""
    from specprobe.core.errors import ConfigError
    from specprobe.judge.rules import load_rules_file

    path = tmp_path / "bomb.yaml"
    path.write_text(_BOMB + "rules: *i\n")
    with pytest.raises(ConfigError, match="expand"):
        load_rules_file(path)


def test_R13_rules_file_unreadable(tmp_path: Path) -> None:
    """On the command line or named in a probe config, the rules loader refuses it in one
    line (not click's usage box)."""
    path = tmp_path / "rules.yaml"
    path.write_text(_rules_yaml([_RULE]))
    path.chmod(0o000)
    for args in (["rules", "list", "--rules", str(path)], ["diagnose", "--rules", str(path), str(tmp_path / "nope"), "self"]):
        line = subprocess_error(run_unprivileged(args, tmp_path))
        assert line == f"error: cannot read rules file {path}: Permission denied — check the path and its permissions"
    cfg = tmp_path / "probe.yaml"
    cfg.write_text(f"target: {tmp_path / 'nope'}\ndrafter: self\nrules: [{path}]\n")
    line = subprocess_error(run_unprivileged(["check", "--config", str(cfg)], tmp_path))
    assert "rules file" in line and "Permission denied" in line


def test_R14_rules_file_missing_or_a_folder(tmp_path: Path) -> None:
    assert "does not exist" in one_line_error(cli("rules", "list", "--rules", tmp_path / "none.yaml"))
    assert "rules file" in one_line_error(cli("rules", "list", "--rules", tmp_path))


# ============================================================================= C: probe configs
# The bomb under keys a config may hold, so no "unknown key" stops it before it is walked.
_KEYS = ("domains", "batch_sizes", "k", "target", "drafter", "seed", "device", "prompts", "rules")
_CONFIG_BOMB = "".join(
    f"{key}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 9 if i else ['"r.yaml"'] * 9) + "]\n" for i, key in enumerate(_KEYS)
)

@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        pytest.param("p.yaml", "max_new_tokenz: 8\n", "unknown key 'max_new_tokenz' — did you mean 'max_new_tokens'?", id="C01-unknown-key"),
        pytest.param("p.yaml", "k_max: eight\n", "k_max: Input should be a valid integer", id="C02-bad-type"),
        pytest.param("p.yaml", "temperature: -1\n", "p.yaml: temperature -1.0 is negative", id="C03-out-of-range"),
        pytest.param("p.yaml", _CONFIG_BOMB, "aliases", id="C04-billion-laughs"),
        pytest.param("p.toml", "k_max = \n", "is not valid TOML", id="C05-bad-toml"),
        pytest.param("p.yaml", "- target: a\n- drafter: b\n", "must be a mapping of keys to values, got a list", id="C06-not-a-mapping"),
        pytest.param("p.yaml", "outputs:\n  json: ''\n", "outputs.json is an empty path", id="C07-empty-path"),
        pytest.param("p.ini", "[probe]\n", "has extension '.ini'", id="C08-unknown-extension"),
        pytest.param("p.yaml", "k_max: 4\nseed: 1\nk_max: 8\n", "duplicate key 'k_max'", id="C09-duplicate-key"),
        pytest.param("p.json", '{"k_max": 4, "k_max": 8}', "duplicate key 'k_max'", id="C10-duplicate-key-json"),
        pytest.param("p.yaml", "domains: " + "[" * 5000 + "]" * 5000 + "\n", "config file", id="C11-deep-nesting"),
        pytest.param("p.yaml", "k: [1, 2, 99]\n", "p.yaml: k [1, 2, 99] is outside [1, 32]", id="C12-bad-value-in-list"),
    ],
)
def test_probe_configs(tmp_path: Path, name: str, text: str, needle: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert needle in one_line_error(cli("check", "--config", path))


def test_C13_config_missing_and_unreadable(tmp_path: Path) -> None:
    assert "does not exist" in one_line_error(cli("check", "--config", "/nonexistent/probe.yaml"))
    path = tmp_path / "probe.yaml"
    path.write_text("k_max: 4\n")
    path.chmod(0o000)
    line = subprocess_error(run_unprivileged(["check", "--config", str(path)], tmp_path))
    assert line == f"error: cannot read config file {path}: Permission denied — check the path and its permissions"
    serving = tmp_path / "serving.yaml"  # a serving config is read by specprobe itself
    serving.write_text("speculative_config: {num_speculative_tokens: 4}\n")
    serving.chmod(0o000)
    cfg = tmp_path / "probe2.yaml"
    cfg.write_text(f"serving_configs: [{serving}]\n")
    line = subprocess_error(run_unprivileged(["check", "--config", str(cfg)], tmp_path))
    assert "Permission denied" in line
    line = subprocess_error(run_unprivileged(["check", "--serving-config", str(serving), str(tmp_path / "nope"), "self"], tmp_path))
    assert line.startswith(f"error: cannot read config file {serving}: Permission denied")


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        pytest.param("p.yaml", "k-max: 4\nseed: 1\nk_max: 8\n", "p.yaml: 'k-max' and 'k_max' are the same key given twice", id="C14-two-spellings"),
        pytest.param("p.toml", 'max_new_tokens = 4\n"max-new-tokens" = 8\n', "'max_new_tokens' and 'max-new-tokens' are the same key given twice", id="C14-two-spellings-toml"),
    ],
)
def test_config_key_given_under_both_spellings(tmp_path: Path, name: str, text: str, needle: str) -> None:
    """Never resolved by whichever came last: the line names both spellings."""
    path = tmp_path / name
    path.write_text(text)
    line = one_line_error(cli("check", "--config", path))
    assert needle in line and "keep one of them" in line


def test_C14_two_spellings_in_a_serving_config(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text('{"num_speculative_tokens": 4, "num-speculative-tokens": 8, "method": "draft_model", "model": "x"}')
    line = one_line_error(cli("check", "--serving-config", path, tmp_path / "nope", "self"))
    assert "'num_speculative_tokens' and 'num-speculative-tokens' are the same key given twice" in line


# ============================================================================= N: non-finite logits
TRIGGER = "w5"  # the input token at which the broken model's logits go bad


def _break_logits(monkeypatch: pytest.MonkeyPatch, spec: str, value: float, trigger_id: int) -> None:
    """Load `spec` as a model whose final hidden state is `value` wherever the input token
    is `trigger_id`: its own forward then returns NaN/inf logits at those positions."""
    import torch

    import specprobe.models.drafters as drafters
    import specprobe.models.loader as loader

    real = loader.load_model

    def load(s: str, *a: Any, **kw: Any) -> Any:
        m = real(s, *a, **kw)
        if s == spec:
            box: dict[str, Any] = {}

            def remember(_mod: Any, args: Any, kwargs: Any) -> None:
                ids = kwargs.get("input_ids", args[0] if args else None)
                box["ids"] = ids

            def spoil(_mod: Any, _inp: Any, out: Any) -> Any:
                ids = box.get("ids")
                if ids is None or ids.shape != out.shape[:2]:
                    return out
                out = out.clone()
                out[ids == trigger_id] = value
                return out

            m.model.register_forward_pre_hook(remember, with_kwargs=True)
            m.model.model.norm.register_forward_hook(spoil)
            assert isinstance(m.model.model.norm, torch.nn.Module)
        return m

    import specprobe.probe.diagnose as diagnose

    for mod in (loader, drafters, diagnose):  # each module that loads models, where it looks load_model up
        monkeypatch.setattr(mod, "load_model", load)


def _trigger_prompts(path: Path) -> Path:
    """Four prompts with dataset references; the trigger token is in the references of
    n0 and n2 (so at scored positions), not in those of n1 and n3."""
    lines = [
        json.dumps({"id": f"n{i}", "prompt": f"w{10 + i} w{20 + i} w{30 + i}", "domain": "chat",
                    "reference": f"w3 {TRIGGER} w9 w11" if i % 2 == 0 else "w3 w8 w9 w11"})
        for i in range(4)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _strict_json(path: Path) -> dict[str, Any]:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{path} holds a bare {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


_RUN = ("--max-new-tokens", "6", "--batch-size", "4", "--temperature", "1", "--cost-ratio", "0.1", "--verify-factor", "1", "--no-cache")


@pytest.mark.parametrize(
    ("side", "value"),
    [pytest.param("target", math.nan, id="N01-target-nan"), pytest.param("drafter", math.inf, id="N02-drafter-inf")],
)
def test_non_finite_logits_are_a_finding(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, side: str, value: float) -> None:
    from tests.helpers.tiny import base_vocab

    spec = str(tiny_pair["target"] if side == "target" else tiny_pair["twin"])
    _break_logits(monkeypatch, spec, value, base_vocab()[TRIGGER])
    out = tmp_path / "r.json"
    res = cli("diagnose", tiny_pair["target"], tiny_pair["twin"], "--prompts", _trigger_prompts(tmp_path / "p.jsonl"), "--reference", "dataset", *_RUN, "--json", out)
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    data = _strict_json(out)
    finding = next(f for f in data["findings"] if f["rule_id"] == "SP107")
    assert finding["severity"] == "error"
    # the prompts with the trigger are named, with the position and the side
    named = {e.split()[0] for e in finding["evidence"]}
    assert named == {"n0", "n2"} and all(side in e and "position" in e for e in finding["evidence"])
    assert data["metrics"]["nonfinite_logit_positions"] == 2
    assert data["metrics"]["num_prompts"] == 2  # n1 and n3 scored; n0 and n2 left out
    assert data["metrics"]["accept_prob_mean"] == pytest.approx(1.0)  # the twin, where the logits are numbers


def test_N04_nan_while_generating_references(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN at every prompt's last token (where generation samples its first token): the
    references are still made, every prompt is left out and named, nothing is nan."""
    from tests.helpers.tiny import base_vocab

    _break_logits(monkeypatch, str(tiny_pair["target"]), math.nan, base_vocab()["<s>"])
    out = tmp_path / "r.json"
    res = cli("diagnose", tiny_pair["target"], tiny_pair["twin"], "--prompts", _trigger_prompts(tmp_path / "p.jsonl"), *_RUN, "--json", out, "--markdown", tmp_path / "r.md")
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    data = _strict_json(out)
    assert "SP107" in {f["rule_id"] for f in data["findings"]}
    assert data["metrics"]["num_prompts"] == 0 and data["metrics"]["nonfinite_logit_positions"] >= 4
    assert not shows_nan((tmp_path / "r.md").read_text())


def test_N03_head_proof_tolerates_the_same_non_finite_positions() -> None:
    import torch

    from specprobe.core.errors import ModelLoadError
    from specprobe.models.anatomy import OutputHead

    head = OutputHead(torch.nn.Identity(), lambda x: x, "none", "tiny")
    theirs = torch.tensor([[1.0, math.nan, 2.0], [0.5, 0.5, math.inf]])
    head.check(theirs.clone(), theirs, "test")  # the same NaN/inf where the forward has them
    spoiled = theirs.clone()
    spoiled[0, 0] = math.nan
    with pytest.raises(ModelLoadError, match="differ from its own forward"):
        head.check(spoiled, theirs, "test")
    off = theirs.clone()
    off[0, 2] = 3.0
    with pytest.raises(ModelLoadError, match="differ from its own forward"):
        head.check(off, theirs, "test")


def test_N05_simulate_with_nan_logits_is_not_a_traceback(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.tiny import base_vocab

    _break_logits(monkeypatch, str(tiny_pair["twin"]), math.nan, base_vocab()["<s>"])  # the drafter's first proposal
    out = tmp_path / "s.json"
    res = cli("simulate", tiny_pair["target"], tiny_pair["twin"], "--prompts", _trigger_prompts(tmp_path / "p.jsonl"), *_RUN, "--k", "2", "--json", out)
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit), res.output
    if res.exit_code == 2:
        assert "NaN" in one_line_error(res) or "non-finite" in one_line_error(res)
    else:
        assert res.exit_code == 1, res.output
        assert "SP107" in {f["rule_id"] for f in _strict_json(out)["findings"]}


# ============================================================================= O: writing outputs
def _v2_result(tmp_path: Path) -> Path:
    from specprobe.report.load import load_result

    path = tmp_path / "result.json"
    path.write_text(load_result(V1_RESULTS / "diagnose.json").to_json())
    return path


def _limited(args: list[str], limit: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "specprobe.cli.main", *args], cwd=cwd, env=env, preexec_fn=cap, capture_output=True, text=True, timeout=300)


def _leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_O01_disk_fills_while_writing_a_report(tmp_path: Path) -> None:
    result = _v2_result(tmp_path)
    out = tmp_path / "out"
    line = subprocess_error(_limited(["report", str(result), "--html", str(out / "r.html"), "-q"], 20_000, tmp_path))
    assert "cannot write" in line and "File too large" in line
    assert _leftovers(out) == []  # no report, no temp file


def test_O02_disk_fills_after_the_first_output(tmp_path: Path) -> None:
    result = _v2_result(tmp_path)
    out = tmp_path / "out"
    proc = _limited(["report", str(result), "--csv", str(out / "csv"), "--html", str(out / "r.html"), "-q"], 20_000, tmp_path)
    assert "File too large" in subprocess_error(proc)
    left = _leftovers(out)
    assert "r.html" not in left and "csv/summary.csv" in left and all(not n.split("/")[-1].startswith(".") for n in left)  # CSV whole, HTML absent


def test_O03_disk_fills_while_writing_csv_tables(tmp_path: Path) -> None:
    result = _v2_result(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    proc = _limited(["report", str(result), "--csv", str(out / "csv"), "-q"], 1_000, tmp_path)
    assert "File too large" in subprocess_error(proc)
    assert _leftovers(out) == []  # the folder appears whole or not at all


def test_O04_cache_folder_unusable(tiny_pair: dict[str, Path], prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "references").write_text("a file where the cache's folder should be")
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(cache))
    out = tmp_path / "r.json"
    res = cli("diagnose", tiny_pair["target"], "self:layers=1", "--prompts", prompts, "--max-new-tokens", "4", "--batch-size", "3",
              "--cost-ratio", "0.1", "--verify-factor", "1", "--json", out, "--fail-on", "never")
    assert res.exit_code == 0, res.output
    assert "cache" in " ".join(res.output.split())
    assert _strict_json(out)["metrics"]["num_prompts"] == 6


# ============================================================================= K: the reference cache
@pytest.fixture(scope="module")
def loaded_target(tiny_pair: dict[str, Path]) -> Any:
    from specprobe.models.loader import load_model

    return load_model(str(tiny_pair["target"]), "cpu", "float32")


def _refs(target: Any, cfg_kw: dict[str, Any] | None = None, use_cache: bool = True) -> list[list[int]]:
    from specprobe.core.progress import Progress
    from specprobe.probe.alignment import effective_sampling
    from specprobe.probe.references import encode_prompts, generate_references
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    cfg = DiagnoseConfig(target="t", drafter="self", max_new_tokens=6, batch_size=2, sampling=SamplingFlags(temperature=1.0), use_cache=use_cache, **(cfg_kw or {}))
    ps = prompts_file(Path(tempfile.mkdtemp()) / "p.jsonl")
    from specprobe.prompts import load_prompts

    prompts = load_prompts(ps).prompts
    encoded = encode_prompts(target, list(prompts), cfg.max_new_tokens)
    pair = effective_sampling(cfg.sampling, target.info.generation_config, None)
    return list(generate_references(target, encoded, pair.target, cfg, Progress()))


def _cache_files(cache: Path) -> list[Path]:
    return sorted((cache / "references").glob("*.jsonl"))


def _count_generate(monkeypatch: pytest.MonkeyPatch, target: Any, pause: float = 0.0) -> list[int]:
    calls: list[int] = []
    real = target.model.generate

    def generate(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        time.sleep(pause)
        return real(*a, **kw)

    monkeypatch.setattr(target.model, "generate", generate)
    return calls


def test_K01_two_runs_share_the_cache_at_once(loaded_target: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))
    fresh = _refs(loaded_target, use_cache=False)
    calls = _count_generate(monkeypatch, loaded_target, pause=0.3)
    results: dict[int, list[list[int]]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = _refs(loaded_target)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert results[0] == fresh and results[1] == fresh
    assert len(calls) == 3  # 6 prompts in batches of 2: each batch generated once, by one run
    (cache_file,) = _cache_files(tmp_path / "cache")
    assert sorted(json.loads(line)["batch"] for line in cache_file.read_text().splitlines()) == [0, 1, 2]


@pytest.mark.parametrize(
    ("spoil",),
    [
        pytest.param(lambda p: p.write_bytes(b"\x00\xff\xfe garbage \x89PNG\r\n" * 50), id="K02-garbage-bytes"),
        pytest.param(lambda p: p.write_text(p.read_text()[:-25]), id="K03-truncated-last-line"),
        pytest.param(lambda p: p.write_text("5\n[1, 2]\nnull\n" + p.read_text()), id="K04-not-objects"),
        pytest.param(lambda p: p.write_text(json.dumps({"batch": 0, "continuations": [[999_999, 3], [1]]}) + "\n" + json.dumps({"batch": 1, "continuations": [["w1"], [2]]}) + "\n"), id="K05-foreign-entries"),
        pytest.param(lambda p: p.write_text(json.dumps({"batch": 0, "continuations": [list(range(4, 40))] * 2}) + "\n"), id="K06-longer-than-the-budget"),
    ],
)
def test_cache_entry_damage_is_detected_and_rebuilt(loaded_target: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Callable[[Path], Any]) -> None:
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))
    first = _refs(loaded_target)
    (cache_file,) = _cache_files(tmp_path / "cache")
    spoil(cache_file)
    again = _refs(loaded_target)
    assert again == first
    for line in cache_file.read_text().splitlines():  # rebuilt: every line a whole, valid batch
        rec = json.loads(line)
        assert isinstance(rec, dict) and all(isinstance(t, int) and 0 <= t < 400 for c in rec["continuations"] for t in c)


# ============================================================================= G: the GGUF dequantisation cache
def _gguf_cache(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[int], list[str]]:
    """A tiny GGUF and a cache in tmp_path whose conversion copies the tiny checkpoint
    (transformers cannot load a synthetic GGUF): counts conversions, collects notes."""
    from specprobe.models import loader

    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[int] = []

    def convert(path: Path, folder: Path) -> None:
        calls.append(1)
        for f in tiny_pair["target"].iterdir():
            if f.is_file():
                shutil.copy(f, folder / f.name)

    monkeypatch.setattr(loader, "_dequantise_into", convert)
    return _tiny_gguf(tmp_path / "m.gguf"), calls, []


def _cut(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _foreign(entry: Path) -> None:
    marker = entry / "specprobe-cache.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "sha256": "0" * 64}))


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        pytest.param(lambda d: (d / "model.safetensors").write_bytes(b"\x00\xff garbage " * 100), "model.safetensors", id="G01-weights-garbage"),
        pytest.param(lambda d: _cut(d / "model.safetensors"), "model.safetensors is", id="G02-weights-truncated"),
        pytest.param(lambda d: (d / "config.json").write_text('{"model_type": "ll'), "config.json", id="G03-config-not-json"),
        pytest.param(lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json is missing", id="G04-file-missing"),
        pytest.param(_foreign, "made from another file", id="G05-foreign-entry"),
        pytest.param(lambda d: (d / "specprobe-cache.json").unlink(), "no specprobe-cache.json", id="G06-no-marker"),
    ],
)
def test_gguf_cache_entry_damage_is_detected_and_rebuilt(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Callable[[Path], Any], why: str) -> None:
    from specprobe.models.cache_check import entry_problem
    from specprobe.models.loader import ensure_gguf_cached, file_sha256

    gguf_file, calls, notes = _gguf_cache(tiny_pair, tmp_path, monkeypatch)
    entry = ensure_gguf_cached(gguf_file, notes.append)
    assert calls == [1] and entry_problem(entry, file_sha256(gguf_file)) is None
    good = {f.name: f.read_bytes() for f in entry.iterdir() if f.name != "specprobe-cache.json"}
    spoil(entry)
    assert ensure_gguf_cached(gguf_file, notes.append) == entry
    assert calls == [1, 1]  # rebuilt, not trusted
    (warning,) = [n for n in notes if "cannot be used" in n]
    assert str(entry) in warning and why in warning and warning.endswith("rebuilding it")
    assert {f.name: f.read_bytes() for f in entry.iterdir() if f.name != "specprobe-cache.json"} == good
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".tmp-")]  # no half-built folder left
    ensure_gguf_cached(gguf_file, notes.append)
    assert calls == [1, 1]  # the rebuilt entry is trusted


def test_G08_two_runs_at_once_convert_once(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs that need the same GGUF at the same moment (two terminals; the test
    suite's workers): one converts, the other waits for it and uses its entry. Before the
    lock both converted, and the second rename replaced a folder the first was reading."""
    from specprobe.models import loader

    gguf_file, calls, _ = _gguf_cache(tiny_pair, tmp_path, monkeypatch)
    convert = loader._dequantise_into

    def slow(path: Path, folder: Path) -> None:
        time.sleep(0.5)  # both runs are past their "is it cached?" check by now
        convert(path, folder)

    monkeypatch.setattr(loader, "_dequantise_into", slow)
    both = threading.Barrier(2)
    got: list[Path] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            both.wait(10)
            got.append(loader.ensure_gguf_cached(gguf_file))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert calls == [1] and len(got) == 2 and got[0] == got[1]
    assert not [p for p in got[0].parent.iterdir() if p.name.startswith(".tmp-")]


def test_G07_entry_from_an_older_specprobe_is_kept(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole entry whose marker predates the sha256 and file sizes is checked by its
    structure and used, not converted again."""
    from specprobe.models.loader import ensure_gguf_cached

    gguf_file, calls, notes = _gguf_cache(tiny_pair, tmp_path, monkeypatch)
    entry = ensure_gguf_cached(gguf_file, notes.append)
    (entry / "specprobe-cache.json").write_text(json.dumps({"source": str(gguf_file), "created": 0}))
    assert ensure_gguf_cached(gguf_file, notes.append) == entry and calls == [1]
    _cut(entry / "model.safetensors")  # still caught without the recorded sizes
    ensure_gguf_cached(gguf_file, notes.append)
    assert calls == [1, 1] and any("model.safetensors is" in n for n in notes)


# ============================================================================= J: result files
def _edited(tmp_path: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    path = _v2_result(tmp_path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda d: d.__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        pytest.param(_set("schema_version", 99), "has schema_version 99; this specprobe reads versions", id="J01-newer-schema"),
        pytest.param(_set("metrics", [1, 2]), "section 'metrics' has the wrong type", id="J02-wrong-type"),
        pytest.param(lambda d: d.pop("target"), "has no 'target' section", id="J03-missing-section"),
        pytest.param(_set("surprise", {"a": 1}), "unexpected field 'surprise'", id="J04-unexpected-field"),
        pytest.param(lambda d: d["k_table"][0].__setitem__("k", "four"), "section 'k_table.0.k' has the wrong type", id="J05-wrong-nested-type"),
        pytest.param(_set("command", "compare"), "is a 'compare' result", id="J06-other-command"),
        pytest.param(lambda d: d.pop("schema_version"), "is not a specprobe result", id="J07-not-a-result"),
    ],
)
def test_hand_edited_results(tmp_path: Path, edit: Callable[[dict[str, Any]], Any], needle: str) -> None:
    path = _edited(tmp_path, edit)
    assert needle in one_line_error(cli("report", path, "-q"))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("", "is empty", id="J08-empty"),
        pytest.param(None, "is truncated", id="J09-truncated"),
        pytest.param("[" * 100_000 + "]" * 100_000, "result", id="J10-deep-nesting"),
        pytest.param(b'{"schema_version": 2, "command": "diagnose", "x": "\xff"}', "is not a text file", id="J11-not-utf8"),
    ],
)
def test_broken_result_files(tmp_path: Path, text: str | bytes | None, needle: str) -> None:
    path = tmp_path / "r.json"
    if text is None:
        full = _v2_result(tmp_path).read_text()
        path.write_text(full[: len(full) * 2 // 3])
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert needle in one_line_error(cli("report", path, "-q"))


def test_J12_non_finite_numbers_written_by_hand(tmp_path: Path) -> None:
    """NaN/Infinity literals (Python's json writes them) are read as 'not measured', never
    shown as nan or inf."""
    path = _v2_result(tmp_path)
    text = re.sub(r'"accept_prob_mean": [0-9.e-]+', '"accept_prob_mean": NaN', path.read_text(), count=1)
    text = re.sub(r'"kl_target_draft_nats": [0-9.e-]+', '"kl_target_draft_nats": Infinity', text, count=1)
    path.write_text(text)
    res = cli("report", path, "--markdown", tmp_path / "r.md")
    if res.exit_code == 2:
        assert "not a finite number" in one_line_error(res)
        return
    assert res.exit_code == 0, res.output
    for shown in (res.output, (tmp_path / "r.md").read_text()):
        assert not shows_nan(shown), shown


def test_J13_compare_given_a_newer_schema_or_a_broken_file(tmp_path: Path) -> None:
    base = _v2_result(tmp_path)
    cand = tmp_path / "cand.json"
    data = json.loads(base.read_text())
    data["schema_version"] = 4
    cand.write_text(json.dumps(data))
    line = one_line_error(cli("compare", base, cand))
    assert str(cand) in line and "schema_version 4" in line
    cand.write_text(base.read_text()[:100])
    assert "is truncated" in one_line_error(cli("compare", base, cand))


def test_J14_result_file_unreadable(tmp_path: Path) -> None:
    """report, explain, compare and merge read their files themselves: one line naming the
    file and the reason, not click's usage box."""
    path = _v2_result(tmp_path)
    path.chmod(0o000)
    for args in (["report", str(path)], ["explain", str(path)], ["compare", str(path), str(path)]):
        line = subprocess_error(run_unprivileged(args, tmp_path))
        assert line == f"error: cannot read {path}: Permission denied — check the path and its permissions", args
    line = subprocess_error(run_unprivileged(["merge", str(path)], tmp_path))
    assert line == f"error: part {path} cannot be read (PermissionError) — check the path and its permissions"


# ============================================================================= W: monitor sources
class Engine:
    """A loopback HTTP server whose answer the test changes: status, body, content type,
    a delay before answering, or a body trickled a byte at a time."""

    def __init__(self) -> None:
        self.status = 200
        self.body: Callable[[], bytes] = lambda: b""
        self.content_type = "text/plain; version=0.0.4"
        self.delay = 0.0
        self.trickle = 0.0
        self.cut = 0  # close the connection after this many bytes of the body
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if outer.delay:
                    time.sleep(outer.delay)
                data = outer.body() if outer.status == 200 else b"<html>503 Service Unavailable</html>"
                self.send_response(outer.status)
                self.send_header("Content-Type", outer.content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    if outer.trickle:  # 40 bytes one at a time, then the rest
                        for i in range(40):
                            self.wfile.write(data[i : i + 1])
                            self.wfile.flush()
                            time.sleep(outer.trickle)
                        data = data[40:]
                    self.wfile.write(data[: outer.cut] if outer.cut else data)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.close()


def _vllm(drafts: int, accepted: int, k: int = 4) -> bytes:
    return (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {drafts}\n'
        "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
        f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {drafts * k}\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {accepted}\n'
    ).encode()


def _monitor(url: str, **kw: Any) -> Any:
    from specprobe.judge.rules import load_table
    from specprobe.monitor.runner import Monitor
    from specprobe.monitor.sources import ScrapeSource

    src = ScrapeSource(url, timeout=kw.pop("timeout", 2.0), retries=0, backoff=0.01)
    return Monitor([src], load_table(), window=300, baseline=600, interval=15, **kw)


def test_W01_endpoint_down() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = one_line_error(cli("monitor", "--once", "--url", f"http://127.0.0.1:{port}/metrics", "--interval", "50ms", "--retries", "0", "--timeout", "1s"))
    assert "no acceptance data" in line and "unreachable" in line


@pytest.mark.parametrize(
    ("fault", "value", "timeout", "said"),
    [
        pytest.param("delay", 2.0, 0.3, "timed out", id="W02-slower-than-the-timeout"),
        # headers at once, then a byte every 0.1 s: each read is quick, the whole answer
        # is not — the timeout bounds the whole request, not each read
        pytest.param("trickle", 0.1, 1.0, "timed out", id="W03-trickles-its-body"),
        pytest.param("cut", 50, 2.0, "cut short", id="W13-connection-closed-mid-body"),
    ],
)
def test_an_endpoint_that_fails_mid_answer_is_a_source_error(engine: Engine, fault: str, value: float, timeout: float, said: str) -> None:
    from specprobe.monitor.sources import ScrapeSource, SourceError

    engine.body = lambda: _vllm(10, 20)
    setattr(engine, fault, value)
    with pytest.raises(SourceError, match=said):
        ScrapeSource(engine.url, timeout=timeout, retries=0).poll(0.0, {}, lambda k, m: None)


def test_W04_endpoint_flapping(engine: Engine) -> None:
    counts = iter([(100, 300), (200, 600), (300, 900), (400, 1200)])
    engine.body = lambda: _vllm(*next(counts))
    mon = _monitor(engine.url)
    st = mon.status[id(mon.sources[0])]
    states = []
    for t, status in ((0.0, 200), (15.0, 503), (30.0, 200), (45.0, 200)):
        engine.status = status
        mon.poll(t)
        states.append(st.state)
    assert states == ["ok", "stale", "ok", "ok"]
    view = mon.evaluate(45.0).models[0]
    # three good scrapes (the 503 read nothing): 100 → 300 drafts of K = 4, 3 accepted each
    assert view.now.accepted == 600 and view.now.draft_tokens == 800 and not view.stale


@pytest.mark.parametrize(
    ("content_type", "body", "needle"),
    [
        pytest.param("text/html", b"<!DOCTYPE html><html><body><form>Sign in</form></body></html>\n", "no acceptance data", id="W05-html"),
        pytest.param("text/plain", None, "no acceptance data", id="W06-10MB-garbage"),
    ],
)
def test_endpoint_answers_something_else(engine: Engine, content_type: str, body: bytes | None, needle: str) -> None:
    import random

    alphabet = b'abc{}="# \n\t0123456789.,:_'
    noise = bytes.maketrans(bytes(range(256)), bytes(alphabet[i % len(alphabet)] for i in range(256)))
    garbage = body or random.Random(0).randbytes(10_000_000).translate(noise)
    engine.content_type = content_type
    engine.body = lambda: garbage
    line = one_line_error(cli("monitor", "--once", "--url", engine.url, "--interval", "50ms", "--retries", "0", "--timeout", "20s", "--no-live"))
    assert needle in line


def test_W07_endpoint_body_over_the_size_cap(engine: Engine) -> None:
    from specprobe.monitor.sources import ScrapeSource, SourceError

    big = b"# " + b"x" * (40 * 1024**2) + b"\n"
    engine.body = lambda: big
    with pytest.raises(SourceError, match="larger than"):
        ScrapeSource(engine.url, timeout=20, retries=0).poll(0.0, {}, lambda k, m: None)


def test_W08_counter_reset(engine: Engine) -> None:
    counts = iter([(1000, 3000), (1100, 3300), (50, 150), (150, 450)])  # restarted between 2 and 3
    engine.body = lambda: _vllm(*next(counts))
    mon = _monitor(engine.url)
    for t in (0.0, 15.0, 30.0, 45.0):
        mon.poll(t)
    view = mon.evaluate(45.0).models[0]
    assert view.resets == 3  # each of the three counters went back to zero once
    assert view.now.drafts == 100 + 50 + 100  # increases, the reset counted from zero
    assert view.now.accept_rate == pytest.approx(0.75)


_V1_LINE = "INFO 05-20 10:{m:02d}:{s:02d} [metrics.py:100] SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 1.0 tokens/s, Drafted throughput: 2.0 tokens/s, Accepted: {a} tokens, Drafted: {d} tokens, Per-position acceptance rate: 0.800, 0.500, 0.200, Avg Draft acceptance rate: 50.0%\n"


def _log_line(i: int, accepted: int = 150, drafted: int = 300) -> str:
    return _V1_LINE.format(m=i // 60, s=i % 60, a=accepted, d=drafted)


def _drain(src: Any, want: Callable[[Any], bool], store: dict[str, Any]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        src.poll(time.time(), store, lambda k, m: None)
        if want(store):
            return
        time.sleep(0.1)


def _accepted(store: dict[str, Any]) -> float:
    from specprobe.monitor.windows import ACCEPTED

    data = store.get("vllm")
    return 0.0 if data is None else sum(v for _, v in data.events.get(ACCEPTED, []))


@pytest.mark.parametrize("how", [pytest.param("rotate", id="W09-rotated"), pytest.param("truncate", id="W10-truncated")])
def test_followed_log_rotated_or_truncated(tmp_path: Path, how: str) -> None:
    from specprobe.monitor.logs import LogSource

    path = tmp_path / "vllm.log"
    path.write_text("".join(_log_line(i) for i in range(4)))
    src = LogSource(str(path), follow=True)
    store: dict[str, Any] = {}
    _drain(src, lambda s: _accepted(s) >= 600, store)
    assert _accepted(store) == 600
    if how == "rotate":
        path.rename(tmp_path / "vllm.log.1")
        path.write_text(_log_line(10, accepted=7))
    else:
        with path.open("r+") as fh:  # logrotate's copytruncate
            fh.truncate(0)
        with path.open("a") as fh:
            fh.write(_log_line(10, accepted=7))
    _drain(src, lambda s: _accepted(s) >= 607, store)
    assert _accepted(store) == 607


def test_W11_followed_log_line_written_in_two_parts(tmp_path: Path) -> None:
    from specprobe.monitor.logs import LogSource

    path = tmp_path / "vllm.log"
    line = _log_line(1)
    path.write_text(line[:70])
    src = LogSource(str(path), follow=True)
    store: dict[str, Any] = {}
    res = src.poll(0.0, store, lambda k, m: None)
    time.sleep(0.5)
    res = src.poll(0.0, store, lambda k, m: None)
    with path.open("a") as fh:
        fh.write(line[70:])
    _drain(src, lambda s: _accepted(s) >= 150, store)
    assert _accepted(store) == 150 and res.malformed == 0 and src.lines_read == 1


def test_W12_log_with_binary_garbage(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_bytes(os.urandom(5000).replace(b"\n", b"") + b"\n" + _log_line(1).encode() + b"\xff\xfe\x00 SpecDecoding metrics: Accepted: x\n")
    res = cli("monitor", "--log", path, "--window", "60s", "--baseline-window", "5m", "--no-live", "--alerts", tmp_path / "a.jsonl")
    assert res.exit_code in (0, 1) and "Traceback" not in res.output, res.output
    assert "malformed" in res.output


# ============================================================================= S: signals
def _signal_in_second_batch(monkeypatch: pytest.MonkeyPatch, signum: int) -> None:
    import specprobe.probe.scoring as scoring

    real = scoring.score_batch
    calls = {"n": 0}

    def batch(*a: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signum)  # a real signal, delivered to this process
            time.sleep(5)  # interrupted by the handler long before this ends
        return real(*a, **kw)

    monkeypatch.setattr(scoring, "score_batch", batch)


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, id="S01-ctrl-c"), pytest.param(signal.SIGTERM, id="S02-sigterm")])
def test_signal_keeps_what_was_computed(tiny_pair: dict[str, Path], prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int) -> None:
    _signal_in_second_batch(monkeypatch, signum)
    out = tmp_path / "r.json"
    res = cli("diagnose", tiny_pair["target"], "self:layers=1", "--prompts", prompts, "--max-new-tokens", "4", "--batch-size", "2",
              "--temperature", "1", "--cost-ratio", "0.1", "--verify-factor", "1", "--json", out)
    assert res.exit_code == 130, res.output
    data = _strict_json(out)
    assert data["interrupted"] is True and data["metrics"]["num_prompts"] == 2


# ============================================================================= the table itself
def test_every_row_of_the_table_has_a_test() -> None:
    rows = re.findall(r"^\|\s*([A-Z]\d{2})\s*\|", DOC.read_text(), flags=re.M)
    assert len(rows) >= 30 and len(rows) == len(set(rows)), rows
    source = Path(__file__).read_text()
    tested = {m.upper() for m in re.findall(r"\b(?:test_|id=\")([A-Za-z]\d{2})[_\-\"]", source)}
    tested |= {m.upper() for m in re.findall(r"test_[A-Za-z]\d{2}_([A-Za-z]\d{2})_", source)}
    missing = [r for r in rows if r not in tested]
    assert not missing, f"rows without a test: {missing}"
    extra = sorted(tested - set(rows))
    assert not extra, f"tests for rows the table lacks: {extra}"
