"""Serving configs: what an engine is actually launched with.

`read_serving_config(path)` returns a `ServingConfig`: the engine, the target and drafter,
the engine's own method name, K, how it drafts (greedy | probabilistic, where the config
says), the sampling it applies to requests that set none, and the engine's knobs.

Each engine's reader is its package's `serving` module (`specprobe.engines.<engine>.serving`:
vLLM's JSON, serve YAML and command lines; SGLang's --config YAML and launch_server
command lines; llama-server's command lines, args and env files; TensorRT-LLM's
--extra_llm_api_options YAML and trtllm-serve command lines), with the surface
`settings.served` describes. This front asks every engine the registry holds which file
is its own: a mapping goes to the reader that claims it most surely, a command line to the
reader whose program starts it, an args file to the one whose flags it holds.

Every number is held to the bounds of the setting it is (`settings.model.check`: K as
--k, a temperature as --temperature) or of the engine's knob, and refused naming where it
was written, `FILE: key` with the key as the file spells it (`launch.sh: --spec-draft-p-min`,
`serve.yaml: speculative-config.num_speculative_tokens`); `ServingConfig.places` names
the same place for each value the merge takes, so its origins do too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.engines import get
from specprobe.settings.config import read_mapping, read_text
from specprobe.settings.served import ServingConfig, normalised, reader, readers
from specprobe.settings.shell import ASSIGN, NAME, Command, commands, is_flag, split_flags

# KV-cache dtypes as the engines spell them, as --kv-cache-dtype takes them: vLLM's
# CacheDType (vllm/config/cache.py; its "fp8" is e4m3 on CUDA) and SGLang's
# --kv-cache-dtype choices (python/sglang/srt/server_args.py). The 16-bit caches hold
# what a bf16/fp16 run computes: auto. e5m2, int8, the FP4 caches and the MLA-specific
# fp8 are not simulated.
_KV_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "bfloat16": "auto", "bf16": "auto", "float16": "auto", "half": "auto"}


def kv_cache_setting(value: str, where: str, engine: str | None = None) -> str:
    """An engine's KV-cache dtype as specprobe's --kv-cache-dtype (auto | fp8 | ggml types
    for llama.cpp), or a one-line refusal naming where it was written."""
    own = getattr(reader(engine), "kv_cache_setting", None) if engine else None
    if own is not None:  # the engine's own types (llama.cpp's ggml ones)
        return own(value, where)
    found = _KV_DTYPES.get(value.strip().lower())
    if found is None:
        raise ConfigError(
            f"{where} {value!r} is a KV-cache dtype specprobe does not simulate (it simulates fp8 e4m3: fp8, fp8_e4m3; and 16-bit caches: auto, bfloat16)",
            "pass --kv-cache-dtype (and --draft-kv-cache-dtype) auto or fp8 to say which to score",
        )
    return found


# ----------------------------------------------------------------------------- files that are mappings
def _from_mapping(data: Mapping[str, Any], path: Path, source: Path | None = None) -> ServingConfig:
    src = source or path
    d, dp = normalised(data, f"{path.name}: ")
    ranked = [(rank, i, r) for i, r in enumerate(readers()) if (rank := r.mapping_rank(d, dp)) is not None]
    if ranked:
        return min(ranked, key=lambda x: x[:2])[2].read_mapping(d, dp, src)
    raise ConfigError(
        f"{path} is none of: a vLLM speculative config or serve YAML, an SGLang launch config, a TensorRT-LLM decoding config",
        "expected keys like method/num_speculative_tokens (vLLM), speculative-algorithm (SGLang) or speculative_config.decoding_type (TensorRT-LLM); a launch script or args file is read by its command line",
    )


def _read_file(path: Path, source: Path) -> ServingConfig:
    """A config file a command line names (TensorRT-LLM's --extra_llm_api_options YAML)."""
    return _from_mapping(read_mapping(path), path, source)


def _program(words: list[str]) -> tuple[ModuleType, int, str] | None:
    """(the engine's reader, index of its first argument, the program as written) for a
    command that starts a serving engine, however it is wrapped (exec, nohup, env,
    numactl, python -m)."""
    for i in range(len(words)):
        for r in readers():
            started = r.program(words, i)
            if started is not None:
                return r, started[0], started[1]
    return None


def _from_command_lines(path: Path) -> ServingConfig:
    """A launch script (or an args file, or an env file of LLAMA_ARG_* lines): the one
    engine command in it, with the environment the script gives that command."""
    text = read_text(path, "serving config")
    name = path.name
    variables: dict[str, str] = {}
    exported: dict[str, tuple[str, str]] = {}  # NAME → (value, where it was set)
    assigned: dict[str, tuple[str, str]] = {}  # plain NAME=value lines (an env file's)
    auto_export = False
    found: list[tuple[Command, list[str], tuple[ModuleType, int, str], dict[str, tuple[str, str]]]] = []
    loose: list[str] = []
    for cmd in commands(text, variables):
        words = cmd.words
        j = 0
        prefix: dict[str, tuple[str, str]] = {}
        while j < len(words) and (m := ASSIGN.match(words[j])):
            prefix[m.group(1)] = (m.group(2), f"{name}: {m.group(1)}")
            j += 1
        rest = words[j:]
        if not rest:
            for var, (value, where) in prefix.items():
                variables[var] = value
                (exported if auto_export else assigned)[var] = (value, where)
            continue
        if rest[0] == "export" or (rest[0] in ("declare", "typeset") and "-x" in rest[1:]):
            for w in rest[1:]:
                m = ASSIGN.match(w)
                if m:
                    variables[m.group(1)] = m.group(2)
                    exported[m.group(1)] = (m.group(2), f"{name}: {m.group(1)}")
                elif NAME.fullmatch(w) and w in variables:
                    exported[w] = (variables[w], assigned.get(w, ("", f"{name}: {w}"))[1])
            continue
        if rest[0] == "set" and any(w.startswith("-") and "a" in w for w in rest[1:]):
            auto_export = True
            continue
        started = _program(rest)
        if started is not None:
            # env A=1 llama-server …, numactl … llama-server: assignments before the program are its environment
            env = {**prefix, **{m.group(1): (m.group(2), f"{name}: {m.group(1)}") for w in rest[: started[1]] if (m := ASSIGN.match(w))}}
            found.append((cmd, rest, started, env))
        elif is_flag(rest[0]):
            loose.extend(rest)
    if len(found) > 1:
        lines = ", ".join(str(c.line) for c, _, _, _ in found)
        raise ConfigError(f"{name} starts {len(found)} serving engines (lines {lines})", "pass a file that starts one, or one command line per serving config")
    if found:
        _, rest, (engine, start, prog), env = found[0]
        return engine.read_args(rest[start:], {**exported, **env}, name, prog, path, _read_file)
    return _args_file(loose, {**assigned, **exported}, name, path)


def _args_file(words: list[str], env: Mapping[str, tuple[str, str]], name: str, path: Path) -> ServingConfig:
    flags, _ = split_flags(words, frozenset(), frozenset())
    given = {f.split(".", 1)[0] for f, _v, _w in flags}
    engines = sorted((r for r in readers() if given & r.ARG_MARKS), key=lambda r: r.ARG_RANK)
    if not engines:
        engines = [r for r in readers() if any(var in r.ENV for var in env)][:1]
    if len(engines) > 1:
        raise ConfigError(f"{name} has flags of {' and '.join(e.ENGINE.label for e in engines)}", "pass one engine's arguments per serving config")
    if not engines:
        raise ConfigError(
            f"{name} starts no serving engine (vllm serve, python -m sglang.launch_server, llama-server, trtllm-serve) and holds no engine arguments",
            "pass the launch script, an args file, a vLLM/SGLang YAML or JSON, or a TensorRT-LLM YAML",
        )
    return engines[0].read_args(words, env, name, "", path, _read_file)


def read_serving_config(path: str | Path) -> ServingConfig:
    """Read what an engine is launched with: a JSON / YAML / TOML config (vLLM, SGLang,
    TensorRT-LLM), or a launch script, args file or env file (any other name)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"serving config {p} does not exist", "pass vLLM's --speculative-config JSON, a vllm serve / SGLang / TensorRT-LLM YAML, or the engine's launch script")
    if p.suffix.lower() in (".json", ".yaml", ".yml", ".toml"):
        return _from_mapping(read_mapping(p), p)
    return _from_command_lines(p)


def describe_serving(sv: ServingConfig) -> str:
    """One line: the engine, drafter, K, drafting and sampling a serving config sets."""
    engine = get(sv.engine).label
    method = f" ({sv.method}{', ' + sv.drafter_kind if sv.drafter_kind else ''})" if sv.method else ""
    k_name = sv.where("k").split(": ", 1)[-1]
    k = f"K = {sv.num_speculative_tokens} ({k_name})" if sv.num_speculative_tokens else "K not set"
    tree = served_tree(sv)
    if tree is not None:
        k = f"a tree: {tree}"
    drafting = f", {sv.drafting} drafting ({sv.where('drafting').split(': ', 1)[-1]})" if sv.drafting else ""
    sampling = ", ".join(f"{k2} {v:g}" for k2, v in {**sv.sampling, **{f"draft_{k3}": v3 for k3, v3 in sv.draft_sampling.items()}}.items()) or "no sampling settings"
    return f"{sv.source.name} ({engine}): drafter {sv.drafter or 'none'}{method}, {k}{drafting}, {sampling}"


def tree_setting(sv: ServingConfig) -> tuple[str, str] | None:
    """The `--tree` value a serving config verifies, and where it was written, or None for
    a chain: SGLang's speculative-eagle-topk > 1 with its num_steps and num_draft_tokens;
    TensorRT-LLM's static `eagle_choices` / `medusa_choices` (rank paths), or its
    `use_dynamic_tree` with `dynamic_tree_max_topK`, `max_draft_len` (depth) and
    `max_total_draft_tokens` (nodes, the root not counted). The engine's reader says."""
    own = getattr(reader(sv.engine), "tree_setting", None)
    return own(sv) if own else None


def served_tree(sv: ServingConfig) -> str | None:
    """The draft tree a serving config verifies, in words, or None for a chain: SGLang's
    EAGLE/STANDALONE with speculative-eagle-topk > 1 drafts topk candidates per step, num_steps
    deep, and verifies num_draft_tokens of them in one pass (topk 1 and num_draft_tokens
    num_steps + 1 is the chain). specprobe's estimates are a chain's. The engine's reader says."""
    own = getattr(reader(sv.engine), "served_tree", None)
    return own(sv) if own else None
