"""Property-based tests of every parser that reads user input: prompt JSONL, the rules
grammar and rules files, probe configs (files and flag values), Prometheus exposition
text and engine log lines. For any input the answer is a result or the parser's own
error — a one-line SpecprobeError for files and flags, SourceError / MalformedLine for
what a monitored engine sends (the monitor counts those and carries on) — never another
exception. A NaN or ±inf number is never a result: wherever it is written (a flag, a probe
config, a serving config) it is refused with a ConfigError naming where.

Deterministic (derandomize: the same examples on every run, no example database) and
small (max_examples modest, no deadline) so CI stays fast and stable."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import string
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from specprobe.core.errors import ConfigError, SpecprobeError
from specprobe.settings.model import BY_NAME, DIAGNOSE, SETTINGS

FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One folder for every example's files (module-scoped: hypothesis runs many examples
    per test call), removed when the module is done rather than kept among pytest's runs."""
    folder = tmp_path_factory.mktemp("props")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def one_line(e: SpecprobeError) -> None:
    text = e.one_line()
    assert text and "\n" not in text and "Traceback" not in text


def result_or_error(fn: Callable[[], Any], *errors: type[BaseException]) -> Any:
    """fn()'s result, or None when it raised one of `errors` (a SpecprobeError's message
    must be one line); any other exception fails the test."""
    try:
        return fn()
    except SpecprobeError as e:
        one_line(e)
        return None
    except errors:
        return None


# ----------------------------------------------------------------------------- strategies
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_value = st.recursive(json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
PROMPT_KEYS = ("prompt", "turns", "id", "question_id", "domain", "category", "reference", "response", "answer")
prompt_obj = st.dictionaries(st.sampled_from(PROMPT_KEYS), json_value, max_size=5)
text_turns = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=3)
good_obj = st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=30)}, optional={"id": st.integers(0, 5) | st.text(max_size=4), "domain": st.text(max_size=10), "turns": text_turns})
jsonl_line = st.one_of(prompt_obj.map(json.dumps), good_obj.map(json.dumps), json_value.map(json.dumps), st.text(max_size=40))


def _write(folder: Path, data: bytes, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(suffix=suffix, dir=folder)
    with os.fdopen(fd, "wb") as fh:  # mkstemp's descriptor, closed: one left open per example adds up to hundreds
        fh.write(data)
    return Path(name)


# ----------------------------------------------------------------------------- prompt JSONL
@FAST
@given(st.lists(jsonl_line, max_size=6), st.sampled_from(["\n", "\r\n", "\n\n"]))
def test_prompt_jsonl_lines(tmp: Path, lines: list[str], sep: str) -> None:
    from specprobe.prompts import load_prompts

    ps = result_or_error(lambda: load_prompts(_write(tmp, sep.join(lines).encode(), ".jsonl")))
    if ps is not None:
        assert ps.prompts and len({p.id for p in ps.prompts}) == len(ps.prompts)
        assert all(p.turns and all(t.strip() for t in p.turns) for p in ps.prompts)


@FAST
@given(st.binary(max_size=300))
@example(b"\xef\xbb\xbf" + b'{"prompt": "a"}')
@example(b'{"prompt": "a"}\n' + b"[" * 50_000)
@example(b"\xff\xfe{")
def test_prompt_jsonl_any_bytes(tmp: Path, data: bytes) -> None:
    from specprobe.prompts import load_prompts

    result_or_error(lambda: load_prompts(_write(tmp, data, ".jsonl")))


# ----------------------------------------------------------------------------- rules grammar
METRICS = ["accept_prob_mean", "kl_target_draft_nats", "greedy_agree_frac", "speedup_best", "nonexistent_metric"]
cond_token = st.one_of(st.sampled_from([*METRICS, "and", "or", "not", "(", ")", "<", "<=", ">", ">=", "==", "!=", "true", "false", "0.5", "30%", "-1", "1e9", "3"]), st.text(alphabet=string.printable, max_size=3))


@FAST
@given(st.lists(cond_token, max_size=12).map(" ".join))
@example("(" * 3000 + "accept_prob_mean < 1" + ")" * 3000)
@example("not " * 3000 + "accept_prob_mean < 1")
@example("accept_prob_mean < 1e999")
def test_condition_grammar(text: str) -> None:
    """parse_condition: a tree or ValueError; a tree evaluates to True/False/None on any
    metrics, never raising."""
    from specprobe.judge.conditions import (
        condition_metrics,
        evaluate,
        parse_condition,
        threshold_text,
    )

    node = result_or_error(lambda: parse_condition(text), ValueError)
    if node is None:
        return
    names = condition_metrics(node)
    threshold_text(node)
    for values in ({}, dict.fromkeys(names, 0.5), dict.fromkeys(names, math.nan), dict.fromkeys(names, "text"), dict.fromkeys(names, math.inf)):
        assert evaluate(node, values) in (True, False, None)


rule_field = st.one_of(st.text(max_size=30), json_value)


@FAST
@given(st.fixed_dictionaries({"id": st.sampled_from(["SP900", "SP1", "XX123", 5]), "name": rule_field, "severity": st.sampled_from(["error", "warning", "info", "fatal", 3]), "when": st.one_of(st.lists(cond_token, max_size=8).map(" ".join), json_value), "diagnosis": rule_field, "remedy": rule_field}, optional={"kinds": json_value, "disable": json_value, "typo": json_value}))
def test_rules_file_entries(tmp: Path, rule: dict[str, Any]) -> None:
    import yaml

    from specprobe.judge.rules import load_rules_file

    f = _write(tmp, yaml.safe_dump({"rules": [rule]}).encode(), ".yaml")
    result_or_error(lambda: load_rules_file(f))


@FAST
@given(st.text(max_size=200))
@example("a: &a [1, 2]\nb: *a\nrules: [*a]")
@example("a: &a [*a]\n")
@example("rules:\n  - &r {id: SP900}\n  - *r\n")
def test_rules_file_any_text(tmp: Path, text: str) -> None:
    from specprobe.judge.rules import load_rules_file

    result_or_error(lambda: load_rules_file(_write(tmp, text.encode(), ".yaml")))


# ----------------------------------------------------------------------------- probe configs
# both spellings of two keys, so a key given twice under its two spellings is drawn too
CONFIG_KEYS = ["target", "drafter", "temperature", "top_k", "top_p", "k_max", "k-max", "k", "max-new-tokens", "max_new_tokens", "batch_sizes", "domains", "prompts", "rules", "outputs", "device", "dtype", "fail_on", "seed", "baseline", "serving_configs", "typo_key"]


@FAST
@given(st.dictionaries(st.sampled_from(CONFIG_KEYS), json_value, max_size=5))
@example({"k_max": 4, "k-max": 8})
def test_probe_config_mapping(tmp: Path, data: dict[str, Any]) -> None:
    from specprobe.settings.config import probe_config_from_mapping

    cfg = result_or_error(lambda: probe_config_from_mapping(data, tmp / "probe.yaml"))
    if cfg is not None:
        cfg.explicit()
        assert cfg.k_values is None or all(1 <= k <= 32 for k in cfg.k_values)
        # never one of two spellings silently dropped
        assert not ({"k_max", "k-max"} <= data.keys() or {"max_new_tokens", "max-new-tokens"} <= data.keys())


@FAST
@given(st.text(max_size=200), st.sampled_from([".yaml", ".toml", ".json"]))
@example("k_max: 4\nk_max: 5\n", ".yaml")
@example('{"a": 1, "a": 2}', ".json")
@example("x = [" * 2000, ".toml")
@example("a: &a [x, x]\nb: &b [*a, *a]\ndomains: *b\n", ".yaml")
def test_probe_config_file_any_text(tmp: Path, text: str, suffix: str) -> None:
    from specprobe.settings.config import load_probe_config

    result_or_error(lambda: load_probe_config(_write(tmp, text.encode(), suffix)))


@FAST
@given(st.fixed_dictionaries({}, optional={"k": st.text(max_size=12), "batch_sizes": st.text(max_size=12), "domains": st.text(max_size=12), "temperature": st.floats(allow_nan=True), "top_p": st.floats(allow_nan=True), "k_max": st.integers(-5, 100), "max_new_tokens": st.integers(-5, 5000), "json_path": st.text(max_size=5), "shard": st.text(max_size=6)}))
@example({"temperature": math.nan})
@example({"top_p": -math.inf, "k_max": -5})  # beside another bad value
def test_command_line_values(tmp: Path, params: dict[str, Any]) -> None:
    """The one merge of flags: options or a one-line error (bad values, empty paths); a
    NaN or ±inf temperature or top-p never options, and alone refused as not a number."""
    from specprobe.settings.options import merge

    given_names = set(params)
    full = {**FLAGS, **params}
    if "json_path" in full:
        full["json_path"] = str(tmp / full["json_path"]) if full["json_path"].strip() else full["json_path"]
    opts = result_or_error(lambda: merge("diagnose", full, given_names))
    not_numbers = [k for k in ("temperature", "top_p") if k in params and not math.isfinite(params[k])]
    if not_numbers:
        assert opts is None, f"{not_numbers} accepted"
    for k in not_numbers:  # another bad value drawn beside it may be the one named above
        with pytest.raises(ConfigError, match=f"^{BY_NAME[k].flag} .* is not a finite number"):
            merge("diagnose", {**FLAGS, k: params[k]}, {k})


# valid values of every setting the merge above needs
FLAGS = {"target": "t", "drafter": "self", "prompts": "builtin", "max_new_tokens": 16, "batch_size": 2, "k_max": 4, "seed": 0, "device": "cpu", "dtype": "auto",
         "fail_on": "error", "reference": "on-policy", "sampling_semantics": "vllm"}
NUMBERS = [s for s in SETTINGS if s.type in (int, float, int | None, float | None) or s.file_type == list[int]]
NOT_NUMBERS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@pytest.mark.parametrize("value", NOT_NUMBERS, ids=str)
@pytest.mark.parametrize("s", NUMBERS, ids=lambda s: s.name)
def test_a_non_finite_number_is_refused_wherever_it_is_written(tmp: Path, s: Any, value: str) -> None:
    """Every numeric setting, NaN, inf or -inf: refused (ConfigError naming where it was
    written) from the command line, from a probe config, and from a serving config."""
    from specprobe.cli.main import app
    from specprobe.settings.config import probe_config_from_mapping
    from specprobe.settings.options import merge
    from specprobe.settings.serving import read_serving_config

    x = NOT_NUMBERS[value]
    command = DIAGNOSE if DIAGNOSE in s.commands else sorted(s.commands)[0]
    if s.file_type != list[int]:  # a list flag is text: '1,nan' is refused by its parser, not as a number
        with pytest.raises(ConfigError, match=f"^{re.escape(s.flag)} .* is not a finite number"):
            merge(command, {**FLAGS, s.name: x}, {s.name})
    if s.type in (float, float | None):  # typed: typer reads nan and inf as floats, the model refuses them
        res = CliRunner().invoke(app, [command, "T", "D", s.flag, value])
        assert res.exit_code == 2 and "is not a finite number" in res.output and len(res.output.strip().splitlines()) == 1, res.output
    if s.file_key is not None:
        with pytest.raises(ConfigError, match=f"^probe.yaml: {re.escape(s.file_key)} .* is not a finite number"):
            probe_config_from_mapping({s.file_key: [1, x] if s.file_type == list[int] else x}, tmp / "probe.yaml")
    for key in s.serving_keys:  # vLLM's spelling of the drafter's sampling too; YAML writes .nan / .inf
        f = _write(tmp, f"model: m\nnum_speculative_tokens: 3\n{key}: {value.replace('nan', '.nan').replace('inf', '.inf')}\n".encode(), ".yaml")
        with pytest.raises(ConfigError, match=f": {re.escape(key)} .* is not a finite number"):
            read_serving_config(f)


# ----------------------------------------------------------------------------- exposition text
metric_name = st.sampled_from(["vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total", "sglang:spec_accept_length", "llamacpp:spec_decode_num_drafts_total", "x"])
label_value = st.text(alphabet=string.printable, max_size=6)
sample_line = st.builds(
    lambda n, labels, v: n + ("{" + ",".join(f'{k}="{val}"' for k, val in labels.items()) + "}" if labels else "") + " " + v,
    metric_name,
    st.dictionaries(st.sampled_from(["model_name", "position", "engine", "le"]), label_value, max_size=3),
    st.one_of(st.floats().map(repr), st.sampled_from(["NaN", "+Inf", "-1", "1e400", "x"])),
)
expo_line = st.one_of(sample_line, st.sampled_from(["# TYPE vllm:spec_decode_num_drafts counter", "# HELP x y", "# TYPE x bogus", "#", ""]), st.text(alphabet=string.printable, max_size=30))


@FAST
@given(st.lists(expo_line, max_size=12).map("\n".join), st.sampled_from(["auto", "vllm", "sglang", "llamacpp"]))
@example('vllm:spec_decode_num_drafts_total{model_name="m} 1', "auto")
@example("\x00\xff garbage {{{", "auto")
def test_exposition_text(text: str, engine: str) -> None:
    from specprobe.monitor.base import SourceError
    from specprobe.monitor.exposition import ingest_samples, parse_exposition

    parsed = result_or_error(lambda: parse_exposition(text), SourceError)
    if parsed is None:
        return
    samples, bad = parsed
    assert bad >= 0
    store: dict[str, Any] = {}
    res = ingest_samples(samples, engine, 0.0, store, "src")
    ingest_samples(samples, engine, 15.0, store, "src")
    assert res.malformed >= 0


# ----------------------------------------------------------------------------- log lines
LOG_MARKERS = [
    "SpecDecoding metrics: ", "Speculative metrics: ", "Decode batch. accept len: ", "draft acceptance rate = ", "draft acceptance = ", "acc per pos = (",
    "n_draft = ", "n_drafted = ", "n_accept = ", "Accepted: ", "Drafted: ", " tokens, ", "Per-position acceptance rate: ", "Mean acceptance length: ",
    " accepted / ", " generated)", "mean len = ", "accept rate: ", "2025-05-20 10:00:01 ", "05-20 10:00:01 ",
]
log_piece = st.one_of(st.sampled_from(LOG_MARKERS), st.integers(-5, 10**6).map(str), st.floats(allow_nan=True).map(repr), st.text(alphabet=string.printable, max_size=6))


@FAST
@given(st.lists(st.lists(log_piece, max_size=10).map("".join), max_size=6))
@example(["draft acceptance = 0.5 (  5 accepted /  10 generated), mean len = 1.5", "acc per pos = (0.5, 0.2)"])
@example(["acc per pos = (nan, 2)", "draft acceptance rate = 0.5 (5 accepted / 0 generated)"])
@example(["SpecDecoding metrics: Accepted: 5 tokens, Drafted: 0 tokens, Per-position acceptance rate: nan"])
def test_log_lines(tmp: Path, lines: list[str]) -> None:
    """parse_log_line: a record, None, or MalformedLine; a log of such lines polls and
    evaluates without raising."""
    from specprobe.monitor.logs import LogSource, parse_log_line
    from specprobe.monitor.records import LogRecord, MalformedLine
    from specprobe.monitor.runner import Monitor

    for line in lines:
        rec = result_or_error(lambda line=line: parse_log_line(line), MalformedLine)
        assert rec is None or isinstance(rec, LogRecord)
    src = LogSource(str(_write(tmp, "\n".join(lines).encode(), ".log")))
    mon = Monitor([src], _rules(), window=300, baseline=600, interval=15)
    mon.poll(0.0)
    snap = mon.evaluate(0.0, anchor_to_data=True)
    json.dumps(snap.to_dict(), allow_nan=False)
    src.close()


@functools.cache
def _rules() -> Any:
    from specprobe.judge.rules import load_table

    return load_table()
