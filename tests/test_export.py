"""specprobe export --engine: each engine's config for the result's recommendation, read
back by the --serving-config reader to the same engine, drafter, K and threshold; the
shapes each engine's own config code accepts (vLLM's batch-size ranges, TensorRT-LLM's
draft_len_schedule, the synthetic rates); the synthetic rates non-increasing and giving
τ = 1 + Σ rates; bad input refused in one line with nothing written."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.engines.trtllm.export import trtllm_schedule
from specprobe.export.serving import (
    export_config,
    schedule_from_costs,
    synthetic_rates,
)
from specprobe.report.load import load_result
from specprobe.result import Result
from specprobe.settings.serving import read_serving_config
from tests.conftest import requires_smollm2
from tests.helpers import one_line_refusal

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "results" / "v1"


def _result(tmp_path: Path, *, kind: str = "independent", spec: str | None = None, drafting: str = "greedy", engine: str = "vllm", beats: bool | None = None, batches: list[tuple[int, int, float]] | None = None, name: str = "result.json", speedup_scale: float = 1.25) -> tuple[Result, Path]:
    """The stored diagnose result made into the case under test (another drafter, a
    procedure, an adaptive verdict, costs timed at several batch sizes), written to disk.
    Its speedups are scaled by speedup_scale: the stored result's (0.78–0.99×) would be
    refused as slower than plain decoding; 1.25 makes them 0.97–1.24×, the best K above 1."""
    base = load_result(DATA / "diagnose.json")
    d: dict[str, Any] = json.loads(base.to_json())
    for row in d["k_table"]:
        if row.get("speedup") is not None:
            row["speedup"] *= speedup_scale
    d["drafter"] = {**d["drafter"], "kind": kind, "spec": spec if spec is not None else str(tmp_path / "draft-model")}
    d["procedure"] = {"engine": engine, "engine_label": engine, "drafting": drafting, "acceptance": "p_target(draft token)", "description": f"{drafting} drafts", "adaptive_knob": "--spec-draft-p-min" if engine == "llama.cpp" else None}
    if beats is not None:
        d["adaptive"] = {**d["adaptive"], "beats_fixed": beats, "threshold": 0.4}
    if batches is not None:
        rows = [{"k": r["k"], "tau_tokens": r["tau_tokens"], "verify_factor": 1.0, "round_cost": 1.2, "speedup": 1.1} for r in d["k_table"]]
        d["cost"] = {**d["cost"], "batch_size": batches[0][0], "batches": [{"batch_size": b, "best_k": k, "speedup_best": s, "rows": rows} for b, k, s in batches]}
    r = Result.model_validate(d)
    path = tmp_path / name
    path.write_text(r.to_json(), encoding="utf-8")
    return r, path


def _write(tmp_path: Path, text: str, name: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ----------------------------------------------------------------------------- round trips
@pytest.mark.parametrize(
    ("engine", "kind", "name", "method"),
    [
        ("vllm", "independent", "spec.json", "draft_model"),
        ("vllm", "eagle3", "serve.yaml", "eagle3"),
        ("sglang", "eagle3", "launch.yaml", "EAGLE3"),
        ("sglang", "independent", "launch.yaml", "STANDALONE"),
        ("llama.cpp", "independent", "server.args", "draft-simple"),
        ("llama.cpp", "eagle3", "server.args", "draft-eagle3"),
        ("trtllm", "eagle3", "extra.yaml", "Eagle3"),
        ("trtllm", "independent", "extra.yaml", "DraftTarget"),
    ],
)
def test_each_export_reads_back_as_the_same_engine_drafter_and_k(tmp_path: Path, engine: str, kind: str, name: str, method: str) -> None:
    spec = f"{kind}:{tmp_path / 'head'}" if kind == "eagle3" else None
    r, src = _result(tmp_path, kind=kind, spec=spec, engine=engine)
    out = tmp_path / name
    res = runner.invoke(app, ["export", str(src), "--engine", engine, "-o", str(out)])
    assert res.exit_code == 0, res.output
    sv = read_serving_config(out)
    assert sv.engine == engine
    assert sv.method == method
    assert sv.drafter_kind == kind
    assert sv.num_speculative_tokens == r.best_k
    want_drafter = str(tmp_path / ("head" if kind == "eagle3" else "draft-model"))
    # llama-server opens GGUF files only: a Hugging Face folder is named as its conversion
    gguf = "-f16.gguf" if engine == "llama.cpp" else ""
    assert sv.drafter == want_drafter + gguf
    if engine != "vllm" or name.endswith(".yaml"):
        assert sv.target == r.target.spec + gguf
        assert "# K = 1: the result's best K" in out.read_text()  # the numbers it rests on
    assert "note: K = 1" in res.output
    if engine == "llama.cpp" or name.endswith(".yaml") and engine in ("vllm", "sglang"):  # served with the sampling measured
        t = r.sampling.target
        assert sv.sampling == {"temperature": t.temperature, "top_k": t.top_k, "top_p": t.top_p, "min_p": t.min_p}


def test_vllm_json_is_the_speculative_config_exactly(tmp_path: Path) -> None:
    r, src = _result(tmp_path, drafting="probabilistic")
    ex = export_config(r, src, "vllm")
    spec = json.loads(ex.text)
    assert spec == {"method": "draft_model", "model": str(tmp_path / "draft-model"), "num_speculative_tokens": 1, "draft_sample_method": "probabilistic"}
    assert read_serving_config(_write(tmp_path, ex.text, "s.json")).drafting == "probabilistic"


def test_sglang_chain_shape(tmp_path: Path) -> None:
    r, src = _result(tmp_path, kind="eagle3", spec=f"eagle3:{tmp_path / 'head'}")
    d = yaml.safe_load(export_config(r, src, "sglang", k=3).text)
    assert d["speculative-num-steps"] == 3 and d["speculative-eagle-topk"] == 1 and d["speculative-num-draft-tokens"] == 4


def test_llamacpp_p_min_only_when_adaptive_beats_fixed(tmp_path: Path) -> None:
    r, src = _result(tmp_path, engine="llama.cpp", beats=True)
    ex = export_config(r, src, "llama.cpp")
    sv = read_serving_config(_write(tmp_path, ex.text, "a.args"))
    assert sv.extra["p_min"] == pytest.approx(0.4)
    assert sv.num_speculative_tokens == max(row.k for row in r.k_table)  # the threshold drafts up to the deepest K
    assert sv.extra["n_min"] == 0
    r2, src2 = _result(tmp_path, engine="llama.cpp", beats=False, name="r2.json")
    ex2 = export_config(r2, src2, "llama.cpp")
    sv2 = read_serving_config(_write(tmp_path, ex2.text, "b.args"))
    assert "p_min" not in sv2.extra and sv2.num_speculative_tokens == r2.best_k
    assert any("does not beat" in n for n in ex2.note)


def test_adaptive_threshold_on_an_engine_without_the_knob_is_a_note(tmp_path: Path) -> None:
    r, src = _result(tmp_path, beats=True)
    ex = export_config(r, src, "vllm")
    assert "p_min" not in ex.text and any("no confidence threshold" in n for n in ex.note)


@pytest.mark.parametrize(
    ("engine", "spec", "name"),
    [("vllm", "ngram:min=2,max=4", "spec.json"), ("llama.cpp", "ngram-simple:size_n=4,size_m=8", "n.args"), ("llama.cpp", "ngram-mod,ngram-simple", "m.args")],
)
def test_an_ngram_drafter_reads_back_as_the_same_drafter(tmp_path: Path, engine: str, spec: str, name: str) -> None:
    from specprobe.drafters.ngram import parse_spec

    r, src = _result(tmp_path, kind="ngram", spec=spec, engine=engine)
    sv = read_serving_config(_write(tmp_path, export_config(r, src, engine).text, name))
    assert sv.drafter_kind is None and sv.drafter_spec is not None
    want = [t.label() for t in parse_spec(spec)]
    got = [t.label() for t in parse_spec(sv.drafter_spec)]
    if engine == "vllm":  # vLLM's K rides along as k=
        assert got == [want[0] + f",k={r.best_k}"] and sv.num_speculative_tokens == r.best_k
    else:
        assert got == want


def test_an_ngram_drafter_for_the_wrong_engine_is_refused(tmp_path: Path) -> None:
    _, src = _result(tmp_path, kind="ngram", spec="ngram-simple")
    one_line_refusal(runner.invoke(app, ["export", str(src), "--engine", "vllm"]), "llama.cpp's n-gram drafter")
    one_line_refusal(runner.invoke(app, ["export", str(src), "--engine", "sglang"]), "its NGRAM is another n-gram algorithm")  # SGLang's own: tests/test_ngram_sglang.py


# ----------------------------------------------------------------------------- schedules
BATCHES = [(1, 4, 1.8), (8, 2, 1.3), (32, 1, 1.05), (128, 1, 0.9)]


def test_vllm_batch_size_schedule_is_what_vllm_validates(tmp_path: Path) -> None:
    r, src = _result(tmp_path, batches=BATCHES)
    sched = schedule_from_costs(r)
    assert sched == [(1, 2, 4), (3, 16, 2), (17, 64, 1), (65, 128, 0)]
    spec = json.loads(export_config(r, src, "vllm").text)
    ranges = spec["num_speculative_tokens_per_batch_size"]
    # vllm/v1/spec_decode/dynamic/utils.py: starts at 1, sorted, no overlap, start ≤ end, k ≥ 0
    assert ranges[0][0] == 1
    assert all(lo <= hi for lo, hi, _ in ranges)
    assert all(ranges[i + 1][0] == ranges[i][1] + 1 for i in range(len(ranges) - 1))
    assert all(k >= 0 for *_, k in ranges)
    assert spec["num_speculative_tokens"] == max(k for *_, k in ranges) == 4
    # --k fixes one K: no schedule
    spec_k = json.loads(export_config(r, src, "vllm", k=2).text)
    assert "num_speculative_tokens_per_batch_size" not in spec_k and spec_k["num_speculative_tokens"] == 2


def test_trtllm_draft_len_schedule_is_what_trtllm_validates(tmp_path: Path) -> None:
    r, src = _result(tmp_path, kind="eagle3", spec=f"eagle3:{tmp_path / 'head'}", batches=BATCHES)
    text = export_config(r, src, "trtllm").text
    sc = yaml.safe_load(text)["speculative_config"]
    sched = sc["draft_len_schedule"]
    assert sched == {2: 4, 16: 2, 64: 1}  # batch 65+ : implicit 0
    # llm_args.py: keys ≥ 1, lengths ≥ 0, the smallest key's length = max_draft_len, none above it
    assert all(b >= 1 and n >= 0 for b, n in sched.items())
    assert sched[min(sched)] == sc["max_draft_len"] and max(sched.values()) <= sc["max_draft_len"]
    assert read_serving_config(_write(tmp_path, text, "t.yaml")).num_speculative_tokens == 4


def test_trtllm_schedule_never_exceeds_the_first_length() -> None:
    from specprobe.engines.export import Plan

    p = Plan(engine="trtllm", source=Path("r.json"), kind="eagle3", method="Eagle3", target=None, drafter=None, k=5, drafting="greedy", schedule=[(1, 2, 3), (3, 8, 5), (9, 40, 0)])
    assert trtllm_schedule(p) == (3, {2: 3, 8: 3})


def test_trtllm_acceptance_floor_is_the_break_even_length(tmp_path: Path) -> None:
    r, src = _result(tmp_path, kind="eagle3", spec=f"eagle3:{tmp_path / 'head'}")
    row = next(x for x in r.k_table if x.k == r.best_k)
    tau = row.tau_renewal_tokens if row.tau_renewal_tokens is not None else row.tau_tokens
    from specprobe.engines.trtllm.export import acceptance_floor

    assert acceptance_floor(r) == ("SP202", 0.30)  # the default table's error band: α < 0.30
    tau_floor = sum(0.30**j for j in range(r.best_k + 1))
    sc = yaml.safe_load(export_config(r, src, "trtllm").text)["speculative_config"]
    assert sc["acceptance_length_threshold"] == pytest.approx(max(tau / row.speedup, tau_floor), abs=1e-3)
    assert sc["acceptance_window"] == r.prompt_set.num_prompts
    assert sc["acceptance_length_threshold"] >= 0 and sc["acceptance_window"] >= 0


# ----------------------------------------------------------------------------- synthetic
def test_synthetic_rates_are_unconditional_non_increasing_and_give_tau(tmp_path: Path) -> None:
    r, src = _result(tmp_path)
    assert r.depth is not None
    for k in range(1, len(r.depth.cumulative) + 1):
        rates = synthetic_rates(r, k)
        assert len(rates) == k and all(0 <= x <= 1 for x in rates)
        assert all(rates[i + 1] <= rates[i] for i in range(k - 1))
        # the depth curve r_j is P(first j accepted): τ(K) = 1 + Σ_j r_j, the window estimate
        row = next(x for x in r.k_table if x.k == k)
        raw = 1 + sum(r.depth.cumulative[:k])
        assert raw == pytest.approx(row.tau_tokens, rel=1e-9)
        assert 1 + sum(rates) == pytest.approx(raw, abs=1e-3)  # the running minimum moves it by rounding only


def test_vllm_synthetic_form(tmp_path: Path) -> None:
    r, src = _result(tmp_path)
    res = runner.invoke(app, ["export", str(src), "--engine", "vllm", "--synthetic", "--k", "3"])
    assert res.exit_code == 0, res.output
    spec = json.loads(res.stdout)
    assert spec["rejection_sample_method"] == "synthetic" and spec["num_speculative_tokens"] == 3
    rates = spec["synthetic_acceptance_rates"]
    assert len(rates) == 3 and rates == sorted(rates, reverse=True)
    assert "synthetic_acceptance_length" not in spec  # vLLM takes exactly one of the two
    assert math.isclose(1 + sum(rates), 1 + sum(synthetic_rates(r, 3)), abs_tol=1e-5)


def test_llamacpp_synthetic_form(tmp_path: Path) -> None:
    r, src = _result(tmp_path, engine="llama.cpp", beats=True)
    text = export_config(r, src, "llama.cpp", k=2, synthetic=True).text
    words = " ".join(ln for ln in text.splitlines() if not ln.startswith("#")).split()
    rates = [float(x) for x in words[words.index("--spec-synth-rates") + 1].split(",")]
    assert len(rates) == int(words[words.index("--spec-draft-n-max") + 1]) == 2  # exactly n-max of them
    assert "--spec-draft-p-min" not in words  # a threshold would cut the drafts the rates assume
    assert read_serving_config(_write(tmp_path, text, "s.args")).num_speculative_tokens == 2


# ----------------------------------------------------------------------------- refusals
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    r, src = _result(tmp_path)
    out = tmp_path / "out.json"
    one_line_refusal(runner.invoke(app, ["export", str(src), "--engine", "vllm", "-o", str(src)]), "also an input")
    assert json.loads(src.read_text())["command"] == "diagnose"  # the input untouched
    one_line_refusal(runner.invoke(app, ["export", str(src), "--engine", "vllm", "--k", "9", "-o", str(out)]), "--k 9")
    one_line_refusal(runner.invoke(app, ["export", str(src), "--engine", "nope", "-o", str(out)]), "--engine")
    one_line_refusal(runner.invoke(app, ["export", str(src), "-o", str(out)]), "--engine", "--training")
    one_line_refusal(runner.invoke(app, ["export", str(src), "--engine", "trtllm", "--synthetic", "-o", str(out)]), "synthetic")
    one_line_refusal(runner.invoke(app, ["export", str(tmp_path / "missing.json"), "--engine", "vllm", "-o", str(out)]), "missing.json")
    one_line_refusal(runner.invoke(app, ["export", str(src), "--engine", "vllm", "--k", "1,2", "-o", str(out)]), "one K")
    skip, skip_src = _result(tmp_path, kind="layer_skip", spec="self:layers=1", name="skip.json")
    one_line_refusal(runner.invoke(app, ["export", str(skip_src), "--engine", "vllm", "-o", str(out)]), "layer-skip")
    med, med_src = _result(tmp_path, kind="medusa", spec=f"medusa:{tmp_path}", name="med.json")
    one_line_refusal(runner.invoke(app, ["export", str(med_src), "--engine", "sglang", "-o", str(out)]), "medusa")
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_the_config_export_starts_without_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    _, src = _result(tmp_path)
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom specprobe.cli.main import app\n"
        f"for engine in ('sglang', 'trtllm', 'vllm'):\n    res = CliRunner().invoke(app, ['export', {str(src)!r}, '--engine', engine])\n    assert res.exit_code == 0, res.output\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nprint('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)  # a hang guard, not a speed bound
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# ----------------------------------------------------------------------------- slower than plain decoding
def test_an_export_predicted_slower_than_plain_decoding_is_refused_in_one_line_and_nothing_written(tmp_path: Path) -> None:
    _, src = _result(tmp_path, speedup_scale=1.0)  # the stored result: 0.989× at its best K
    out = tmp_path / "serve.yaml"
    res = runner.invoke(app, ["export", str(src), "--engine", "vllm", "-o", str(out)])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert "0.989×" in lines[0] and "SP301" in lines[0] and "would slow this target down" in lines[0] and "--force" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize(("engine", "name"), [("vllm", "serve.yaml"), ("llama.cpp", "server.args"), ("sglang", "launch.yaml"), ("trtllm", "extra.yaml")])
def test_force_writes_it_with_the_prediction_it_came_from(tmp_path: Path, engine: str, name: str) -> None:
    _, src = _result(tmp_path, speedup_scale=1.0, engine=engine)
    out = tmp_path / name
    res = runner.invoke(app, ["export", str(src), "--engine", engine, "-o", str(out), "--force"])
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    pred = next(ln for ln in text.splitlines() if ln.startswith("# prediction:"))
    assert "speedup 0.989× at K = 1" in pred and "α = " in pred and "τ = " in pred and str(src.resolve()) in pred and "--force" in pred
    if engine != "llama.cpp":
        yaml.safe_load(text)  # the comment leaves the YAML the engine parses intact


def test_a_faster_export_records_its_prediction_and_the_vllm_json_stays_vllms_own_keys(tmp_path: Path) -> None:
    _, src = _result(tmp_path)
    res = runner.invoke(app, ["export", str(src), "--engine", "vllm", "-o", str(tmp_path / "spec.json")])
    assert res.exit_code == 0, res.output
    assert set(json.loads((tmp_path / "spec.json").read_text(encoding="utf-8"))) <= {"method", "model", "num_speculative_tokens", "draft_sample_method", "num_speculative_tokens_per_batch_size"}
    assert "note: prediction: speedup 1.24× at K = 1" in res.output  # the JSON has no comments: its prediction on stderr
    res = runner.invoke(app, ["export", str(src), "--engine", "vllm", "-o", str(tmp_path / "serve.yaml")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "serve.yaml").read_text(encoding="utf-8").splitlines()[1].startswith("# prediction: speedup 1.24× at K = 1")


def test_a_synthetic_export_is_a_benchmark_and_not_refused(tmp_path: Path) -> None:
    _, src = _result(tmp_path, speedup_scale=1.0)
    res = runner.invoke(app, ["export", str(src), "--engine", "vllm", "--synthetic", "--k", "2", "-o", str(tmp_path / "synth.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "synth.json").read_text(encoding="utf-8"))["rejection_sample_method"] == "synthetic"


# ----------------------------------------------------------------------------- files the engines open
def _with_target(r: Result, src: Path, target: str) -> Result:
    d: dict[str, Any] = json.loads(r.to_json())
    d["config"]["target"] = target
    d["target"] = {**d["target"], "spec": target}
    out = Result.model_validate(d)
    src.write_text(out.to_json(), encoding="utf-8")
    return out


def test_llamacpp_names_the_conversion_of_a_hugging_face_folder_to_run_first(tmp_path: Path) -> None:
    r, src = _result(tmp_path, kind="eagle3", spec=f"eagle3:{tmp_path / 'head'}", engine="llama.cpp")
    out = tmp_path / "server.args"
    res = runner.invoke(app, ["export", str(src), "--engine", "llama.cpp", "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    head = tmp_path / "head"
    convert = f"python convert_hf_to_gguf.py {head} --outfile {head}-f16.gguf --outtype f16"
    assert f"-md {head}-f16.gguf" in text.splitlines()
    assert f"-m {r.target.spec}-f16.gguf" in text.splitlines()
    for where in (text, res.output):  # in the file's comments and on stderr, as what must run first
        assert f"run first: the EAGLE-3 head {head} is a Hugging Face checkpoint" in where and convert in where
    ex = export_config(r, src, "llama.cpp")
    assert ex.plan.prepare == [f"python convert_hf_to_gguf.py {r.target.spec} --outfile {r.target.spec}-f16.gguf --outtype f16", convert]


def test_llamacpp_keeps_a_gguf_and_downloads_a_repo_id_before_converting_it(tmp_path: Path) -> None:
    r, src = _result(tmp_path, kind="independent", spec=str(tmp_path / "draft.gguf"), engine="llama.cpp")
    r = _with_target(r, src, "HuggingFaceTB/SmolLM2-1.7B-Instruct")
    ex = export_config(r, src, "llama.cpp")
    lines = ex.text.splitlines()
    assert f"-md {tmp_path / 'draft.gguf'}" in lines and "-m SmolLM2-1.7B-Instruct-f16.gguf" in lines
    assert ex.plan.prepare == ["hf download HuggingFaceTB/SmolLM2-1.7B-Instruct --local-dir SmolLM2-1.7B-Instruct", "python convert_hf_to_gguf.py SmolLM2-1.7B-Instruct --outfile SmolLM2-1.7B-Instruct-f16.gguf --outtype f16"]


def test_vllm_refuses_a_gguf_that_is_not_here(tmp_path: Path) -> None:
    r, src = _result(tmp_path, kind="independent", spec=str(tmp_path / "missing.gguf"))
    res = runner.invoke(app, ["export", str(src), "--engine", "vllm"])
    assert res.exit_code == 2
    assert f"the draft model {tmp_path / 'missing.gguf'} is not a file here" in res.output


def test_vllm_json_names_the_command_line_that_serves_it_and_synthetic_support(tmp_path: Path) -> None:
    r, src = _result(tmp_path)
    out = tmp_path / "spec.json"
    res = runner.invoke(app, ["export", str(src), "--engine", "vllm", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert f'note: serve it: vllm serve {r.target.spec} --speculative-config "$(cat {out})" --override-generation-config' in res.output
    ex = export_config(r, src, "vllm", k=2, synthetic=True)
    assert any("vLLM 0.32.0 takes this form" in n for n in ex.note)


@requires_smollm2
@pytest.mark.parametrize(("engine", "key"), [("sglang", "model-path: "), ("trtllm", "model: ")])
def test_sglang_and_trtllm_exports_name_the_builtin_target_as_its_checkpoint_folder(tmp_path: Path, engine: str, key: str) -> None:
    """SGLang and TensorRT-LLM open Hugging Face folders, not specprobe's built-in names:
    the built-in target is written as the folder specprobe dequantised its GGUF into."""
    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached
    from specprobe.result import Result

    r, src = _result(tmp_path, kind="independent", engine=engine)
    d: dict[str, Any] = json.loads(r.to_json())
    d["config"]["target"] = "smollm2"
    d["target"] = {**d["target"], "spec": "smollm2"}
    src.write_text(Result.model_validate(d).to_json(), encoding="utf-8")
    out = tmp_path / "serve.yaml"
    res = CliRunner().invoke(app, ["export", str(src), "--engine", engine, "-o", str(out), "--force"])
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    folder = ensure_gguf_cached(builtin_gguf_path("smollm2"))
    assert f'{key}"{folder}"' in text and '"smollm2"' not in text
    assert "serves the checkpoint folder specprobe dequantised it into" in text


def test_vllm_serves_at_the_precision_the_result_scored_at(tmp_path: Path) -> None:
    """dtype: the result's own (vLLM's auto would serve a float32 checkpoint in bfloat16):
    `dtype:` in the YAML, `--dtype` on the JSON's serve line — unless that is wider than
    the checkpoint stores (a bfloat16 checkpoint scored in float32 on a CPU is not pinned
    to float32: twice the memory), or the checkpoint's precision is unknown; none for a
    result that does not say."""
    r, src = _result(tmp_path)
    d: dict[str, Any] = json.loads(r.to_json())
    for stored, scored, pinned in (("float32", "float32", True), ("bfloat16", "bfloat16", True), ("float32", "bfloat16", True),
                                   ("bfloat16", "float32", False), (None, "float32", False)):  # fmt: skip
        ckpt = tmp_path / f"ckpt-{stored}"
        ckpt.mkdir(exist_ok=True)
        (ckpt / "config.json").write_text(json.dumps({"torch_dtype": stored} if stored else {}), encoding="utf-8")
        d["environment"] = {**d["environment"], "dtype": scored}
        d["target"] = {**d["target"], "spec": str(ckpt)}
        src.write_text(Result.model_validate(d).to_json(), encoding="utf-8")
        ex = export_config(Result.model_validate(d), src, "vllm", output=tmp_path / "serve.yaml")
        assert (f'dtype: "{scored}"' in ex.text.splitlines()) == pinned, (stored, scored, ex.text)
        res = runner.invoke(app, ["export", str(src), "--engine", "vllm", "-o", str(tmp_path / "spec.json")])
        assert res.exit_code == 0 and (f"--dtype {scored}\n" in res.output) == pinned, res.output
        assert ("dtype not pinned" in res.output) != pinned, res.output
    d["environment"] = None
    assert "dtype" not in export_config(Result.model_validate(d), src, "vllm", output=tmp_path / "serve.yaml").text
