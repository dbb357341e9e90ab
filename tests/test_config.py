"""Probe config files (YAML/TOML → ProbeConfig) and serving configs (vLLM, SGLang, llama.cpp, TensorRT-LLM).

Every file in sample_configs/ is loaded here by what it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from specprobe.core.errors import ConfigError
from specprobe.settings.config import ProbeConfig, load_probe_config, probe_config_from_mapping
from specprobe.settings.model import for_command
from specprobe.settings.options import merge
from specprobe.settings.serving import describe_serving, read_serving_config

SAMPLES = Path(__file__).resolve().parent.parent / "sample_configs"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ----------------------------------------------------------------------------- sample configs
def test_every_sample_config_is_loaded() -> None:
    """Each file in sample_configs/ is read by the loader for its kind."""
    seen = set()
    for path in sorted(SAMPLES.iterdir()):
        if path.name.startswith("probe-"):
            cfg = load_probe_config(path)
            assert cfg.target == "smollm2" and cfg.drafter == "self:layers=28", path
        elif path.name.startswith(tuple(SERVING_SAMPLES)):
            sc = read_serving_config(path)
            engine = next(e for prefix, e in SERVING_SAMPLES.items() if path.name.startswith(prefix))
            assert sc.engine == engine and sc.drafter and sc.num_speculative_tokens, path
        elif path.name.startswith("github-actions-"):
            _check_workflow(path)
        else:
            raise AssertionError(f"no test loads {path.name}; add it to this test")
        seen.add(path.name)
    assert {
        "probe-smollm2.yaml",
        "probe-smollm2.toml",
        "vllm-speculative-config.json",
        "sglang-launch.yaml",
        "llama-server-launch.sh",
        "trtllm-extra-llm-api-options.yaml",
        "github-actions-drafter-gate.yml",
    } <= seen


# serving-config samples by name: the engine each is for
SERVING_SAMPLES = {"vllm-": "vllm", "sglang-": "sglang", "llama-server-": "llama.cpp", "trtllm-": "trtllm"}


def _check_workflow(path: Path) -> None:
    wf = yaml.safe_load(path.read_text(encoding="utf-8"))
    # YAML 1.1 reads the bare key `on` as True
    assert "jobs" in wf and (True in wf or "on" in wf)
    steps = [s for job in wf["jobs"].values() for s in job["steps"]]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "specprobe diagnose --config sample_configs/probe-smollm2.yaml" in runs
    assert "specprobe compare" in runs and "--fail-on" in runs and "--junit" in runs and "--markdown" in runs
    assert "GITHUB_STEP_SUMMARY" in runs
    # the config it points at exists and loads
    load_probe_config(SAMPLES / "probe-smollm2.yaml")


def test_yaml_probe_config_fields() -> None:
    cfg = load_probe_config(SAMPLES / "probe-smollm2.yaml")
    assert cfg.temperature == 0.7 and cfg.draft_temperature == 0.7 and cfg.top_p == 0.95
    assert cfg.k_values == list(range(1, 9)) and cfg.reference == "on-policy" and cfg.fail_on == "error"
    assert cfg.domains == ["code", "math", "chat", "summarization", "translation", "qa"]
    # relative paths resolve against the config file's folder, not the working directory
    assert cfg.outputs is not None and cfg.outputs.json_path == (SAMPLES.parent / "out" / "candidate.json").resolve()
    assert cfg.baseline == (SAMPLES.parent / "out" / "baseline.json").resolve()
    assert cfg.serving_configs == [(SAMPLES / "sglang-launch.yaml").resolve(), (SAMPLES / "vllm-speculative-config.json").resolve()]
    assert cfg.prompts == "builtin" and cfg.source == SAMPLES / "probe-smollm2.yaml"


def test_toml_probe_config_fields() -> None:
    cfg = load_probe_config(SAMPLES / "probe-smollm2.toml")
    assert cfg.temperature == 0.0 and cfg.k_max == 6 and cfg.k_values == [1, 2, 3, 4, 5, 6]
    assert cfg.device == "cpu" and cfg.fail_on == "warning"
    assert cfg.outputs.junit == (SAMPLES.parent / "out" / "smoke-junit.xml").resolve()
    assert cfg.outputs.html is None


# ----------------------------------------------------------------------------- errors
def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    p = _write(tmp_path, "probe.yaml", "target: smollm2\ntemprature: 0.7\n")
    with pytest.raises(ConfigError) as e:
        load_probe_config(p)
    assert "unknown key 'temprature'" in e.value.message and str(p) in e.value.message
    assert "did you mean 'temperature'" in e.value.hint


def test_unknown_key_in_toml_and_in_outputs(tmp_path: Path) -> None:
    p = _write(tmp_path, "probe.toml", 'target = "smollm2"\nkmax = 4\n')
    with pytest.raises(ConfigError, match=r"probe\.toml: unknown key 'kmax'"):
        load_probe_config(p)
    p = _write(tmp_path, "out.yaml", "outputs:\n  htm: report.html\n")
    with pytest.raises(ConfigError, match=r"out\.yaml: unknown key 'outputs\.htm'") as e:
        load_probe_config(p)
    assert "did you mean 'html'" in e.value.hint


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("temperature: -1\n", r"bad\.yaml: temperature -1\.0 is negative"),
        ("top_p: 1.5\n", r"bad\.yaml: top_p 1\.5 is outside \(0, 1\]"),
        ("top_p: .nan\n", r"bad\.yaml: top_p nan is not a finite number"),
        ("temperature: .inf\n", r"bad\.yaml: temperature inf is not a finite number"),
        ("reference: offline\n", r"bad\.yaml: reference 'offline' is not one of on-policy, dataset"),
        ("fail_on: sometimes\n", r"bad\.yaml: fail_on 'sometimes' is not one of error, warning, info, never"),
        ("device: tpu\n", r"device: Value error, use auto, cpu, cuda or cuda:N"),
        ("k: [0, 2]\n", r"bad\.yaml: k \[0, 2\] is outside \[1, 32\]"),
        ("k_max: 64\n", r"bad\.yaml: k_max 64 is out of range \[1, 32\]"),
        ("outputs:\n  markdown: ''\n", r"outputs\.markdown is an empty path"),
        ("sampling_semantics: tgi\n", r"bad\.yaml: sampling_semantics 'tgi' is not one of vllm, sglang, llama.cpp, transformers"),
        ("k: [2, 9]\nk_max: 4\n", r"k lists 9 but k_max is 4"),
        ("max_prompts: many\n", r"max_prompts: Input should be a valid integer"),
        ("- a\n- b\n", r"must be a mapping"),
        ("target: [unclosed\n", r"is not valid YAML"),
        ("domains: []\n", r"domains: Value error, list at least one domain"),
    ],
)
def test_bad_values_are_config_errors_naming_the_file(tmp_path: Path, text: str, pattern: str) -> None:
    p = _write(tmp_path, "bad.yaml", text)
    with pytest.raises(ConfigError, match=pattern) as e:
        load_probe_config(p)
    assert "bad.yaml" in e.value.message and "\n" not in e.value.one_line()


def test_missing_file_bad_extension_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_probe_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="extension '.ini'"):
        load_probe_config(_write(tmp_path, "x.ini", "a=1"))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_probe_config(_write(tmp_path, "x.toml", "target = \n"))


def test_empty_file_is_an_empty_config(tmp_path: Path) -> None:
    cfg = load_probe_config(_write(tmp_path, "empty.yaml", ""))
    assert cfg.explicit() == {} and cfg.k_values is None


# ----------------------------------------------------------------------------- merging with flags
def test_hyphenated_keys_single_values_and_explicit(tmp_path: Path) -> None:
    p = _write(tmp_path, "p.yaml", "max-new-tokens: 48\nk: 4\nrules: team.yaml\nprompts: data/q.jsonl\n")
    cfg = load_probe_config(p)
    assert cfg.max_new_tokens == 48 and cfg.k == [4]
    assert cfg.rules == [(tmp_path / "team.yaml").resolve()]
    assert cfg.prompts == str((tmp_path / "data" / "q.jsonl").resolve())
    assert cfg.explicit() == {"max_new_tokens": 48, "k": [4], "rules": cfg.rules, "prompts": cfg.prompts}


def test_explicit_is_keyed_as_written() -> None:
    cfg = load_probe_config(SAMPLES / "probe-smollm2.yaml")
    vals = cfg.explicit()
    assert vals["drafter"] == "self:layers=28" and "seed" in vals and "min_p" not in vals
    assert vals["outputs.html"] == (SAMPLES.parent / "out" / "report.html").resolve()


def test_config_is_frozen_and_in_memory_mapping_works() -> None:
    cfg = probe_config_from_mapping({"target": "smollm2", "temperature": 0.5})
    assert isinstance(cfg, ProbeConfig)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.temperature = 1.0  # type: ignore[misc]


# ----------------------------------------------------------------------------- serving configs
def test_vllm_speculative_config_json() -> None:
    sc = read_serving_config(SAMPLES / "vllm-speculative-config.json")
    assert (sc.engine, sc.method, sc.drafter_kind, sc.num_speculative_tokens) == ("vllm", "draft_model", "independent", 4)
    assert sc.drafter == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert sc.temperature is None  # vLLM takes sampling per request unless the config sets it
    assert sc.extra == {"draft_tensor_parallel_size": 1}


def test_vllm_config_with_sampling_and_eagle3(tmp_path: Path) -> None:
    p = _write(tmp_path, "spec.json", json.dumps({"method": "eagle3", "model": "org/eagle3-head", "num_speculative_tokens": 3, "temperature": 0.6, "draft_temperature": 0.0}))
    sc = read_serving_config(p)
    assert sc.drafter_kind == "eagle3" and sc.temperature == 0.6 and sc.draft_temperature == 0.0


def test_vllm_serve_yaml_with_generation_override(tmp_path: Path) -> None:
    p = _write(tmp_path, "serve.yaml", 'model: org/target\nspeculative-config: \'{"method": "deepseek_mtp", "num_speculative_tokens": 1}\'\noverride-generation-config: \'{"temperature": 0.6, "top_p": 0.95}\'\n')
    sc = read_serving_config(p)
    assert (sc.target, sc.drafter_kind, sc.num_speculative_tokens, sc.temperature) == ("org/target", "mtp", 1, 0.6)


def test_sglang_launch_config() -> None:
    sc = read_serving_config(SAMPLES / "sglang-launch.yaml")
    assert (sc.engine, sc.method, sc.drafter_kind) == ("sglang", "STANDALONE", "independent")
    assert sc.target == "HuggingFaceTB/SmolLM2-1.7B-Instruct" and sc.drafter == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert sc.num_speculative_tokens == 4 and sc.extra["speculative_num_draft_tokens"] == 5
    assert sc.sampling == {"temperature": 1.0, "top_p": 0.95}


def test_sampling_from_flags_files_and_serving_configs(tmp_path: Path) -> None:
    """The sample pair: the probe measures at 0.7, the SGLang server samples at 1.0."""
    params = {s.name: s.default_for("check") for s in for_command("check")}
    probe = SAMPLES / "probe-smollm2.yaml"  # its serving configs: sglang-launch.yaml, then vllm-speculative-config.json
    opts = merge("check", params, set(), probe)
    # a probe file beats a serving config; the server's top_p… is the file's too, and the
    # drafter's top_p is the file's; nothing the vLLM config says is sampling
    assert (opts.temperature, opts.origins["temperature"]) == (0.7, "probe-smollm2.yaml: temperature")
    assert (opts.engine, opts.origins["engine"]) == ("vllm", "probe-smollm2.yaml: engine")  # the two configs run two engines
    assert [sv.source.name for sv in opts.servings] == ["sglang-launch.yaml", "vllm-speculative-config.json"]
    # what each place said, for the conflict rule
    assert opts.declared == {"probe-smollm2.yaml": {"temperature": 0.7, "top_p": 0.95, "top_k": 0.0}, "sglang-launch.yaml": {"temperature": 1.0, "top_p": 0.95}}
    # a flag typed on the command line wins over everything and is named as such
    opts = merge("check", {**params, "temperature": 0.6, "serving_config": [SAMPLES / "sglang-launch.yaml"]}, {"temperature", "serving_config"})
    assert opts.origins["temperature"] == "--temperature" and opts.declared["command line"] == {"temperature": 0.6}
    assert (opts.top_p, opts.origins["top_p"]) == (0.95, "sglang-launch.yaml: preferred-sampling-params.top_p")
    # a serving config's own draft settings go to the drafter side
    spec = _write(tmp_path, "spec.json", json.dumps({"method": "eagle3", "model": "h", "temperature": 0.6, "draft_temperature": 0.0}))
    opts = merge("check", {**params, "serving_config": [spec]}, {"serving_config"})
    assert (opts.temperature, opts.draft_temperature, opts.origins["draft_temperature"]) == (0.6, 0.0, "spec.json: draft_temperature")
    line = describe_serving(read_serving_config(SAMPLES / "sglang-launch.yaml"))
    assert "drafter HuggingFaceTB/SmolLM2-135M-Instruct" in line and "K = 4" in line and "temperature 1" in line


@pytest.mark.parametrize(
    ("name", "text", "pattern"),
    [
        ("x.json", '{"hello": 1}', "is none of: a vLLM speculative config or serve YAML, an SGLang launch config, a TensorRT-LLM decoding config"),
        ("x.yaml", "speculative-algorithm: EAGLE3\npreferred-sampling-params: '{bad'\n", "preferred-sampling-params is not valid JSON"),
        ("x.json", '{"method": "eagle3",', "not valid JSON"),
    ],
)
def test_bad_serving_configs(tmp_path: Path, name: str, text: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        read_serving_config(_write(tmp_path, name, text))
    with pytest.raises(ConfigError, match="does not exist"):
        read_serving_config(tmp_path / "missing.json")
