"""The settings model: every numeric setting refuses NaN, ±inf and out-of-range values
the same way from each place a user writes it — a flag, a probe config, a serving
config — with one line naming that place and exit code 2; the typer options, the
probe-config keys and docs/settings.md all come from the one table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ConfigError
from specprobe.settings.config import ProbeConfig, load_probe_config
from specprobe.settings.model import BY_NAME, SETTINGS, Setting, check, for_command, markdown_table
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
from specprobe.settings.serving import read_serving_config
from tests.helpers import one_line_refusal

runner = CliRunner()
DOCS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


def _numeric(s: Setting) -> bool:
    t = s.file_type or s.type
    return any(x in (int, float) for x in (t, *getattr(t, "__args__", ())))


def _is_int(s: Setting) -> bool:
    t = s.file_type or s.type
    return int in (t, *getattr(t, "__args__", ())) and float not in (t, *getattr(t, "__args__", ()))


NUMERIC = [s for s in SETTINGS if _numeric(s) and s.file_key is not None]
BOUNDED = [s for s in NUMERIC if any(b is not None for b in (s.ge, s.gt, s.le, s.lt))]


def _outside(s: Setting) -> float:
    """A value just outside the setting's bounds."""
    if s.ge is not None:
        return s.ge - 1
    if s.gt is not None:
        return s.gt - (1 if _is_int(s) else 0.5)
    if s.le is not None:
        return s.le + 1
    assert s.lt is not None
    return s.lt + (1 if _is_int(s) else 0.5)


def _command(s: Setting) -> str:
    return next(c for c in ("diagnose", "simulate", "check", "compare") if c in s.commands)


def test_the_tables_agree() -> None:
    assert NUMERIC and BOUNDED, "the model lists no numeric setting"
    assert {"temperature", "top_p", "min_p", "k_max", "cost_ratio", "verify_factor", "adaptive_threshold", "batch_size", "max_new_tokens"} <= {s.name for s in BOUNDED}
    file_keys = set(ProbeConfig.model_fields) - {"source", "outputs"}
    assert file_keys == {s.file_key for s in SETTINGS if s.file_key and "." not in s.file_key}


@pytest.mark.parametrize("s", [s for s in NUMERIC if not _is_int(s) and s.parse is None], ids=lambda s: s.name)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_a_float_flag_refuses_non_finite_values(s: Setting, bad: str) -> None:
    res = runner.invoke(app, [_command(s), "t", "d", s.flag, bad])
    one_line_refusal(res, f"{s.flag} {float(bad)!r}", "is not a finite number")


@pytest.mark.parametrize("s", [s for s in BOUNDED if s.parse is None], ids=lambda s: s.name)
def test_a_flag_out_of_range_is_refused_naming_the_flag(s: Setting) -> None:
    value = _outside(s)
    text = str(int(value)) if _is_int(s) else repr(float(value))
    res = runner.invoke(app, [_command(s), "t", "d", s.flag, text])
    one_line_refusal(res, s.flag, text)


@pytest.mark.parametrize("flag", ["--k", "--batch-sizes"])
def test_a_list_flag_out_of_range_is_refused(flag: str) -> None:
    res = runner.invoke(app, ["simulate", "t", "d", flag, "0,2"])
    one_line_refusal(res, flag, "'0,2'")


@pytest.mark.parametrize("s", NUMERIC, ids=lambda s: s.name)
@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf"])
def test_a_probe_config_refuses_non_finite_values(tmp_path: Path, s: Setting, bad: str) -> None:
    value = f"[1, {bad}]" if (s.file_type or s.type) == list[int] else bad
    p = tmp_path / "probe.yaml"
    p.write_text(f"{s.file_key}: {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_probe_config(p)
    assert e.value.message.startswith(f"probe.yaml: {s.file_key}"), e.value.message
    # and from the command line's --config, the same one line
    res = runner.invoke(app, [_command(s), "--config", str(p)])
    one_line_refusal(res, f"probe.yaml: {s.file_key}")


@pytest.mark.parametrize("s", BOUNDED, ids=lambda s: s.name)
def test_a_probe_config_out_of_range_is_refused_with_the_flags_words(tmp_path: Path, s: Setting) -> None:
    value = _outside(s)
    written = int(value) if _is_int(s) or (s.file_type == list[int]) else value
    p = tmp_path / "probe.yaml"
    p.write_text(f"{s.file_key}: {json.dumps([written] if s.file_type == list[int] else written)}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as file_error:
        load_probe_config(p)
    with pytest.raises(ConfigError) as direct:
        check(s.name, [written] if s.file_type == list[int] else (int(value) if _is_int(s) else float(value)), s.flag)
    # the same words after the place: "probe.yaml: top_p 1.5 is outside (0, 1]" / "--top-p 1.5 is outside (0, 1]"
    assert file_error.value.message.split(": ", 1)[1].split(" ", 1)[1] == direct.value.message.split(" ", 1)[1]
    assert file_error.value.hint == direct.value.hint


SERVING_SAMPLING = [s for s in SETTINGS if s.serving_keys]


@pytest.mark.parametrize("s", SERVING_SAMPLING, ids=lambda s: s.name)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "outside"])
def test_a_serving_config_refuses_bad_sampling(tmp_path: Path, s: Setting, bad: Any) -> None:
    value = _outside(s) if bad == "outside" else bad
    if bad == "outside" and s.name.endswith("top_k"):
        value = -2  # -1 is the engines' own spelling of "off" (vLLM, SGLang): read as 0
    spec = {"method": "draft_model", "model": "m", "num_speculative_tokens": 4, s.serving_keys[0]: value}
    p = tmp_path / "vllm.json"
    p.write_text(json.dumps(spec), encoding="utf-8")  # json writes NaN / Infinity, which JSON readers accept
    with pytest.raises(ConfigError) as e:
        read_serving_config(p)
    assert e.value.message.startswith(f"vllm.json: {s.serving_keys[0]} "), e.value.message
    res = runner.invoke(app, ["check", "t", "d", "--serving-config", str(p)])
    one_line_refusal(res, f"vllm.json: {s.serving_keys[0]}")


def test_sglang_preferred_sampling_is_checked_too(tmp_path: Path) -> None:
    p = tmp_path / "sglang.yaml"
    p.write_text("model-path: t\nspeculative-algorithm: EAGLE\nspeculative-draft-model-path: d\npreferred-sampling-params: '{\"temperature\": -0.5}'\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^sglang\.yaml: preferred-sampling-params\.temperature -0\.5 is negative"):
        read_serving_config(p)


def test_a_config_built_in_code_is_held_to_the_same_bounds() -> None:
    with pytest.raises(ConfigError, match=r"^--k-max 33 is out of range \[1, 32\]"):
        DiagnoseConfig(target="t", drafter="d", k_max=33)
    with pytest.raises(ConfigError, match=r"^--temperature inf is not a finite number"):
        DiagnoseConfig(target="t", drafter="d", sampling=SamplingFlags(temperature=math.inf))


def test_choices_are_one_line_errors_from_flag_and_file(tmp_path: Path) -> None:
    one_line_refusal(runner.invoke(app, ["diagnose", "t", "d", "--fail-on", "bogus"]), "--fail-on 'bogus' is not one of error, warning, info, never")
    p = tmp_path / "probe.yaml"
    p.write_text("fail_on: bogus\n", encoding="utf-8")
    one_line_refusal(runner.invoke(app, ["diagnose", "t", "d", "--config", str(p)]), "probe.yaml: fail_on 'bogus' is not one of")


def test_every_command_has_exactly_the_models_settings() -> None:
    import typer

    group: Any = typer.main.get_command(app)
    for command in ("check", "diagnose", "simulate", "sweep", "compare", "merge", "demo", "report"):
        params = {p.name for p in group.commands[command].params}
        want = {s.name for s in for_command(command)}
        assert want <= params, f"{command} lacks {sorted(want - params)}"
        for name in params & set(BY_NAME):
            if command in BY_NAME[name].commands:
                opt = next(p for p in group.commands[command].params if p.name == name)
                assert BY_NAME[name].flag in (opt.opts if opt.param_type_name == "option" else [opt.metavar])


def test_the_settings_doc_is_current() -> None:
    assert DOCS.read_text(encoding="utf-8") == markdown_table(), "run: python -m specprobe.settings > docs/settings.md"
