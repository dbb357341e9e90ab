"""The one settings model: every setting a run can be given, defined once.

Each `Setting` says its command-line flag, help, its group in --help (`panel`), type,
default and bounds (finite numbers only), which commands take it, its key in probe configs
(and in serving configs, for the sampling ones) and whether the result records it. Everything else comes from this table:

- the typer options of every command (`command_parameters`, used by `cli.common.takes_settings`);
- the value checks — `check(name, value, where)` refuses a bad value the same way whether
  it was typed as a flag, written in a probe config or in a serving config, naming the
  place (`--temperature`, `probe.yaml: temperature`, `vllm.json: temperature`);
- the probe-config keys (`settings.config` builds its pydantic model from `file_type`);
- the table of settings in docs/settings.md (`python -m specprobe.settings > docs/settings.md`).

Adding a setting is one `Setting(...)` row here and the code that uses its value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError, OutputError
from specprobe.engines import DEFAULT, DRAFT_SAMPLING, NAMES, SEMANTICS
from specprobe.settings.lengths import parse_context_lengths
from specprobe.settings.values import (
    K_LIMIT,
    parse_batch_sizes,
    parse_ks,
    parse_max_memory,
    parse_shard,
    parse_tree,
)

CHECK, DIAGNOSE, SIMULATE, SWEEP, COMPARE, MERGE, DEMO, REPORT, MONITOR, RULES, ALERTS = "check", "diagnose", "simulate", "sweep", "compare", "merge", "demo", "report", "monitor", "rules", "alerts"
EXPORT = "export"
COMMANDS = (CHECK, DIAGNOSE, SIMULATE, SWEEP, COMPARE, MERGE, DEMO, REPORT, MONITOR, RULES, ALERTS, EXPORT)
MODELS = frozenset({CHECK, DIAGNOSE, SIMULATE, SWEEP})  # commands that load a target
RUNS = frozenset({DIAGNOSE, SIMULATE, SWEEP})  # commands that run forward passes on prompts
REPORTS = frozenset({DIAGNOSE, SIMULATE, COMPARE, MERGE, REPORT})  # commands that write every report

DTYPES = ("auto", "float32", "bfloat16", "float16")
REFERENCES = ("on-policy", "dataset")
FAIL_ON = ("error", "warning", "info", "never")
QUANT_SCHEMES = ("fp8", "fp8:per-tensor", "fp8-dynamic", "int8", "w8a8-int8", "int4")  # RTN weight (and W8A8 activation) quantization (specprobe.precision.quant)
KV_CACHE_DTYPES = ("auto", "fp8")  # vLLM's --kv-cache-dtype spellings this simulates
# --help's groups of options (`Setting.panel`; a command's own options name theirs too), in the
# order a command with more than HELP_GROUP_ABOVE options shows them: the pair, sampling and
# outputs before the specialist ones; monitor's own panels beside the ones they resemble
PAIR, SAMPLING_PANEL, PROMPTS, OUTPUTS_PANEL, GATE = "Target and drafter", "Sampling", "Prompts and references", "Outputs", "Gate"
PROCEDURE, SHAPE, COST, PRECISION, SCALE = "Engine procedure", "Draft shape", "Cost", "Precision as served", "Scale"
SOURCES, WINDOWS, RECORDS = "Sources", "Windows", "Per-request records"  # monitor's
PANELS = (PAIR, SOURCES, SAMPLING_PANEL, PROMPTS, WINDOWS, RECORDS, OUTPUTS_PANEL, GATE, PROCEDURE, SHAPE, COST, PRECISION, SCALE)
HELP_GROUP_ABOVE = 12  # a command with at most this many options lists them in one group

# llama.cpp's --cache-type-k / --cache-type-v types this simulates (common/arg.cpp's list but iq4_nl)
GGML_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def parse_kv_cache_dtype(text: str, where: str) -> str:
    """--kv-cache-dtype's value: auto | fp8 | a ggml type, or K/V apart as `q8_0/f16`
    (llama-server's -ctk and -ctv); a pair of equal types is written once."""
    t = str(text).strip().lower()
    if t in KV_CACHE_DTYPES or t in GGML_KV_TYPES:
        return t
    k, sep, v = t.partition("/")
    if sep and k in GGML_KV_TYPES and v in GGML_KV_TYPES:
        return k if k == v else f"{k}/{v}"
    raise ConfigError(
        f"{where} {text!r} is not a KV-cache dtype specprobe simulates",
        f"use auto, fp8 (vLLM's e4m3), one of llama.cpp's {', '.join(GGML_KV_TYPES)}, or K/V apart such as q8_0/f16",
    )


@dataclass(frozen=True)
class Setting:
    """One setting: how it is typed, written, bounded, and where it applies."""

    name: str  # the command's parameter and the options' attribute
    flag: str  # "--temperature"; an argument's metavar ("TARGET") when `argument`
    help: str
    type: Any  # the type typer parses the flag as
    default: Any = None
    panel: str = ""  # its group in --help, one of PANELS
    commands: frozenset[str] = frozenset()
    # probe-config key ("outputs.json" for a nested one), None: not in probe configs
    file_key: str | None = None
    file_type: Any = None  # the value's type in a probe config (None: as the flag's)
    # commands that take the key from a file (None: all that have the flag); a file's
    # outputs are where the run it configures writes, never check's or compare's
    file_commands: frozenset[str] | None = None
    serving_keys: tuple[str, ...] = ()  # its spelling in vLLM / SGLang configs
    recorded: bool = True  # in the result's config
    # bounds: numbers must be finite and within them
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    hint: str = ""  # what to do when a value is refused
    parse: Callable[[str, str], Any] | None = None  # text → value (lists, shards), raising ConfigError
    argument: bool = False
    metavar: str | None = None
    show_default: bool = True
    help_by_command: dict[str, str] = field(default_factory=dict)
    default_by_command: dict[str, Any] = field(default_factory=dict)
    # the command declares the parameter itself (compare's BASELINE.json argument); the
    # model still owns its file key and checks
    declared_by_command: bool = False

    def default_for(self, command: str) -> Any:
        return self.default_by_command.get(command, self.default)

    def help_for(self, command: str) -> str:
        return self.help_by_command.get(command, self.help)

    def takes_file_key(self, command: str) -> bool:
        return self.file_key is not None and command in (self.file_commands if self.file_commands is not None else self.commands)

    def bounds_text(self) -> str:
        """'≥ 0', '(0, 1]', '1 … 32' — for the docs and the refusals."""
        lo = f"[{_n(self.ge)}" if self.ge is not None else f"({_n(self.gt)}" if self.gt is not None else None
        hi = f"{_n(self.le)}]" if self.le is not None else f"{_n(self.lt)})" if self.lt is not None else None
        if lo and hi:
            return f"{lo}, {hi}"
        if lo:
            return f"≥ {_n(self.ge)}" if self.ge is not None else f"> {_n(self.gt)}"
        if hi:
            return f"≤ {_n(self.le)}" if self.le is not None else f"< {_n(self.lt)}"
        return ", ".join(self.choices)


def _n(x: float | None) -> str:
    return f"{x:g}" if x is not None else ""


def _domains(text: str, where: str) -> list[str] | None:
    return [d.strip() for d in str(text).split(",") if d.strip()] or None


def _parsers() -> dict[str, Callable[[str, str], Any]]:
    def max_memory(text: str, where: str) -> str:
        parse_max_memory(text, where)
        return str(text)

    def shard(text: str, where: str) -> tuple[int, int]:
        sh = parse_shard(text, where)
        return (sh.index, sh.count)

    return {"ks": parse_ks, "batch_sizes": parse_batch_sizes, "max_memory": max_memory, "shard": shard, "domains": _domains}


_P = _parsers()
_OUT = "outputs."
_TEMP_HINT = "use 0 for greedy or a positive temperature"

SETTINGS: tuple[Setting, ...] = (
    # ------------------------------------------------------------------ the pair
    Setting("target", "TARGET", "Target model: a checkpoint folder, a .gguf file, a Hugging Face repo id (downloaded unless cached), or 'smollm2' (built-in).", str | None, panel=PAIR, commands=MODELS, file_key="target", argument=True, show_default=False),
    Setting(
        "drafter", "DRAFTER",
        "Drafter: a checkpoint folder, a .gguf file, 'smollm2', 'self', 'self:layers=N', or a head: 'eagle3:DIR', 'eagle:DIR', 'medusa:DIR', 'mtp' / 'mtp:DIR'.",
        str | None, panel=PAIR, commands=MODELS - {SWEEP}, file_key="drafter", argument=True, show_default=False,
    ),
    Setting(
        "revision", "--revision",
        "The target's revision on the Hugging Face hub (a branch, tag or commit hash) when TARGET is a repo id, downloaded unless the cache holds it. Default: main.",
        str | None, panel=PAIR, commands=MODELS, file_key="revision", metavar="REV", show_default=False,
    ),
    Setting(
        "draft_revision", "--draft-revision",
        "The drafter's revision on the Hugging Face hub when DRAFTER is (or names) a repo id, as --revision. Default: main.",
        str | None, panel=PAIR, commands=MODELS - {SWEEP}, file_key="draft_revision", metavar="REV", show_default=False,
    ),
    Setting(
        "against", "--against",
        "A live server of --engine serving this pair (e.g. http://127.0.0.1:8000): after the estimate, send it the run's prompts (as token ids, with the run's sampling and seeds; four at a time where its answers carry their own counters, as vLLM's do with --per-request-spec-decode-metrics, else one at a time) and set its measured acceptance beside the prediction (rules SP7xx). Today: vLLM.",
        str | None, panel=PROCEDURE, commands=frozenset({DIAGNOSE}), file_key="against", metavar="URL", show_default=False,
    ),
    Setting(
        "against_model", "--against-model",
        "The model name the --against server serves the target as (its /v1/models id). Default: the one model it serves.",
        str | None, panel=PROCEDURE, commands=frozenset({DIAGNOSE}), file_key="against_model", metavar="NAME", show_default=False,
    ),
    Setting(
        "against_timeout", "--against-timeout",
        "Seconds the --against exchange may take in all; what the server answered by then is compared.",
        float, 900.0, panel=PROCEDURE, commands=frozenset({DIAGNOSE}), file_key="against_timeout", gt=0, metavar="S",
    ),
    Setting(
        "target_server", "--target-server",
        "Score against a target an engine already serves (e.g. http://127.0.0.1:8000: vLLM's OpenAI-compatible server, or SGLang's with --engine sglang): it writes the references and scores them teacher-forced (prompt logprobs, top --target-logprobs per position), the DRAFTER runs here. Then TARGET may be left out (given: the tokenizer to use). Where the drafter's token is not in the top-n, acceptance is a range, both ends reported.",
        str | None, panel=PAIR, commands=frozenset({DIAGNOSE}), file_key="target_server", metavar="URL", show_default=False,
    ),
    Setting(
        "target_model", "--target-model",
        "The model name the --target-server serves the target as (its /v1/models id). Default: the one model it serves.",
        str | None, panel=PAIR, commands=frozenset({DIAGNOSE}), file_key="target_model", metavar="NAME", show_default=False,
    ),
    Setting(
        "target_logprobs", "--target-logprobs",
        "With --target-server: the top-n target logprobs asked per position (at most the server's --max-logprobs, vLLM's default 20; -1: the whole vocabulary, exact but heavy, vLLM only). SGLang also scores the drafter's own tokens: greedy drafting exact at any n..",
        int, 20, panel=PAIR, commands=frozenset({DIAGNOSE}), file_key="target_logprobs", ge=-1, metavar="N",
    ),
    Setting(
        "target_widen", "--target-widen",
        "With --target-server: a prompt whose positions the top --target-logprobs leaves loose is asked again with top-N, cut after its last loose position (N above --target-logprobs and at most the server's --max-logprobs; -1: the whole vocabulary). 0: off. The result's remote section says how many positions became exact and what it cost.",
        int, 0, panel=PAIR, commands=frozenset({DIAGNOSE}), file_key="target_widen", ge=-1, metavar="N",
    ),
    Setting(
        "offline", "--offline",
        "Never download: a Hugging Face repo id must be in the local cache (as HF_HUB_OFFLINE=1). Without it a repo id not cached is downloaded.",
        bool, False, panel=PAIR, commands=MODELS, file_key="offline", recorded=False,
    ),
    # ------------------------------------------------------------------ sampling, target side then drafter side
    Setting("temperature", "--temperature", "Target sampling temperature (0 = greedy). Default: generation_config, else 1.", float | None, panel=SAMPLING_PANEL, commands=MODELS | {DEMO}, file_key="temperature", file_commands=MODELS, serving_keys=("temperature",), ge=0, hint=_TEMP_HINT,
            default_by_command={DEMO: 0.7}, help_by_command={DEMO: "Target (and, but for one row, drafter) temperature."}),
    Setting("top_k", "--top-k", "Target top-k (0 = off).", int | None, panel=SAMPLING_PANEL, commands=MODELS, file_key="top_k", serving_keys=("top_k",), ge=0, hint="use 0 for off"),
    Setting("top_p", "--top-p", "Target top-p (1 = off).", float | None, panel=SAMPLING_PANEL, commands=MODELS, file_key="top_p", serving_keys=("top_p",), gt=0, le=1, hint="use e.g. 0.9, or 1 for off"),
    Setting("min_p", "--min-p", "Target min-p (0 = off).", float | None, panel=SAMPLING_PANEL, commands=MODELS, file_key="min_p", serving_keys=("min_p",), ge=0, lt=1, hint="use e.g. 0.05, or 0 for off"),
    Setting("draft_temperature", "--draft-temperature", "Drafter temperature. Default: its generation_config, else the target's.", float | None, panel=SAMPLING_PANEL, commands=MODELS, file_key="draft_temperature", serving_keys=("draft_temperature",), ge=0, hint=_TEMP_HINT),
    Setting("draft_top_k", "--draft-top-k", "Drafter top-k (default: the target's).", int | None, panel=SAMPLING_PANEL, commands=MODELS, file_key="draft_top_k", serving_keys=("draft_top_k",), ge=0, hint="use 0 for off"),
    Setting("draft_top_p", "--draft-top-p", "Drafter top-p (default: the target's).", float | None, panel=SAMPLING_PANEL, commands=MODELS, file_key="draft_top_p", serving_keys=("draft_top_p",), gt=0, le=1, hint="use e.g. 0.9, or 1 for off"),
    Setting(
        "sampling_semantics", "--sampling-semantics",
        "Whose sampling transform to reproduce: vllm | sglang | transformers | llama.cpp (order of the transforms: llama.cpp truncates before the temperature; defaults such as transformers' top-k 50 and do_sample). Default: the --engine's.",
        str | None, None, panel=SAMPLING_PANEL, commands=MODELS, file_key="sampling_semantics", choices=SEMANTICS, show_default=False,
    ),
    # ------------------------------------------------------------------ the engine's draft-and-verify procedure
    Setting(
        "engine", "--engine",
        "The serving engine whose draft-and-verify procedure to predict: vllm | sglang | llama.cpp | trtllm | transformers. It sets the sampling transform and how drafts are made and accepted.",
        str, DEFAULT, panel=PROCEDURE, commands=MODELS | {EXPORT}, file_key="engine", file_commands=MODELS, choices=NAMES,
        default_by_command={EXPORT: None}, help_by_command={EXPORT: "The engine to write a serving config for: vllm | sglang | llama.cpp | trtllm."},
    ),
    Setting(
        "draft_sampling", "--draft-sampling",
        "How the drafter proposes: greedy (its argmax, accepted with p_target of it; vLLM's default draft_sample_method) or probabilistic (sampled from q, accepted with Σ min(p, q)). Default: the --engine's.",
        str | None, None, panel=PROCEDURE, commands=MODELS, file_key="draft_sampling", choices=DRAFT_SAMPLING, show_default=False,
    ),
    Setting(
        "draft_p_min", "--draft-p-min",
        "llama.cpp's --spec-draft-p-min: every draft stops before the first token whose probability among the drafter's 10 best (temperature 1) is below this; 0 = off. τ, the depth curves and simulate's rounds follow it. --engine llama.cpp only.",
        float, 0.0, panel=PROCEDURE, commands=RUNS, file_key="draft_p_min", ge=0, le=1, hint="a probability in [0, 1]; 0 drafts K tokens every round",
    ),
    Setting(
        "draft_n_min", "--draft-n-min",
        "llama.cpp's --spec-draft-n-min: a draft shorter than this (cut by --draft-p-min or the token budget) is dropped and the round decodes one token; 0 = off. --engine llama.cpp only.",
        int, 0, panel=PROCEDURE, commands=RUNS, file_key="draft_n_min", ge=0, le=K_LIMIT, hint=f"use 0 ≤ N ≤ {K_LIMIT}",
    ),
    Setting(
        "accept_threshold_single", "--accept-threshold-single",
        "SGLang's --speculative-accept-threshold-single: a draft whose target probability is at least this is accepted outright; 1 = off (exact). Below 1 the output is no longer the target's distribution. --engine sglang only.",
        float, 1.0, panel=PROCEDURE, commands=RUNS, file_key="accept_threshold_single", gt=0, le=1, hint="a probability in (0, 1]; 1 keeps SGLang's exact verification",
    ),
    Setting(
        "accept_threshold_acc", "--accept-threshold-acc",
        "SGLang's --speculative-accept-threshold-acc: a draft is accepted with probability min(1, p_target ÷ this); 1 = off (exact). --engine sglang only.",
        float, 1.0, panel=PROCEDURE, commands=RUNS, file_key="accept_threshold_acc", gt=0, le=1, hint="a probability in (0, 1]; 1 keeps SGLang's exact verification",
    ),
    # ------------------------------------------------------------------ prompts and references
    Setting("prompts", "--prompts", "'builtin' or a JSONL file (Spec-Bench/MT-Bench questions, or {prompt, domain} lines).", str, "builtin", panel=PROMPTS, commands=RUNS, file_key="prompts"),
    Setting("domains", "--domains", "Comma-separated domains to keep, e.g. code,math.", str | None, panel=PROMPTS, commands=RUNS, file_key="domains", file_type=list[str], parse=_P["domains"]),
    Setting("max_prompts", "--max-prompts", "At most this many prompts, taken round-robin over the file's categories (Spec-Bench's 13), else across domains.", int | None, panel=PROMPTS, commands=RUNS | {DEMO}, file_key="max_prompts", file_commands=RUNS, ge=1, hint="leave it out for every prompt",
            default_by_command={DEMO: 12}, help_by_command={DEMO: "Prompts from the built-in suite (round-robin over 6 domains)."}),
    Setting("max_new_tokens", "--max-new-tokens", "Reference continuation length per prompt.", int, 64, panel=PROMPTS, commands=RUNS | {DEMO}, file_key="max_new_tokens", file_commands=RUNS, ge=1, hint="use a positive integer, e.g. 64",
            default_by_command={DEMO: 48}, help_by_command={SIMULATE: "Tokens generated per prompt (and reference length for the estimate).", DEMO: "Reference tokens per prompt."}),
    Setting("reference", "--reference", "on-policy (sampled from the target, default) or dataset (responses in the prompts file; off-policy).", str, "on-policy", panel=PROMPTS, commands=RUNS, file_key="reference", choices=REFERENCES),
    Setting("seed", "--seed", "Seed for sampling (on-policy references; the simulate loop).", int, 0, panel=PROMPTS, commands=RUNS, file_key="seed"),
    Setting("batch_size", "--batch-size", "Sequences per forward pass.", int, 8, panel=SCALE, commands=RUNS, file_key="batch_size", ge=1, hint="use a positive integer, e.g. 8",
            help_by_command={SIMULATE: "Prompts decoded together; each row advances by its own accepted count."}),
    # ------------------------------------------------------------------ draft lengths and costs
    Setting("batch_sizes", "--batch-sizes", "Also time the costs at these batch sizes, e.g. 1,8,32, and estimate the speedup at each (the run's --batch-size is always timed).", str | None,
            panel=COST, commands=RUNS, file_key="batch_sizes", file_type=list[int], parse=_P["batch_sizes"], ge=1, hint="list batch sizes such as 1,8,32", show_default=False),
    Setting("context_lengths", "--context-lengths", "Score prompts built to these token lengths instead of the prompt set as given, e.g. 1k,2k,4k,8k (k = 1,024; one question per domain after documents from the set, or a longer prompt cut to the length) and report α, τ and their decay across lengths by domain (SP209); up to the target's context.", str | None,
            panel=PROMPTS, commands=frozenset({DIAGNOSE}), file_key="context_lengths", file_type=list[int], parse=parse_context_lengths, ge=16, hint="list token lengths such as 1k,2k,4k,8k", show_default=False),
    Setting("tree", "--tree", "Estimate (and in simulate, run) a draft tree instead of a chain: SGLang's steps=S,topk=T,tokens=N (depth, candidates per step, nodes verified with the root; EAGLE-2's selection by cumulative draft probability), or a static tree as a JSON list of rank paths ('[[0],[0,0],[1]]', Medusa's medusa_choices, TensorRT-LLM's eagle_choices). topk=1,tokens=S+1 is the chain. --engine sglang or trtllm.",
            str | None, panel=SHAPE, commands=RUNS | {EXPORT}, file_key="tree", file_commands=RUNS, parse=parse_tree, metavar="steps=S,topk=T,tokens=N", show_default=False,
            help_by_command={EXPORT: "Export this draft tree from the result's tree grid (SGLang's steps=S,topk=T,tokens=N; the result's own static tree as its JSON paths). Default: the result's own tree, else its best tree when that beats its best chain; --k exports the chain of that K."}),
    Setting("tree_estimate", "--tree-estimate", "How diagnose estimates the run's own tree: paths drafts it on its candidate paths at starts of the references (--tree-paths-stride) and verifies it with the target (each node's children and acceptance after its own path; a greedy target on its own text needs no target pass), reference gives every node at depth d the reference's depth-d candidates and target probabilities, as the grid's other trees are estimated (no extra forwards).",
            str, "paths", panel=SHAPE, commands=RUNS, file_key="tree_estimate", choices=("paths", "reference")),
    Setting("tree_paths_stride", "--tree-paths-stride", "With --tree-estimate paths: draft the tree on its candidate paths at every N-th start of each reference and estimate the other starts along the reference, shifted by the mean difference the drafted starts measured (its standard error is reported). 1 drafts every start (at T = 0 on the target's own text, exactly what the tree loop accepts); default: about 128 starts in all (N = positions ÷ 128, at least 1), so the pass costs about the same for any number of prompts.",
            int | None, None, panel=SHAPE, commands=RUNS, file_key="tree_paths_stride", ge=1, hint="use 1 to draft every start, or leave it out for about 128 starts", show_default=False),
    Setting("k_max", "--k-max", f"Largest draft length K in the estimated τ(K)/speedup table (at most {K_LIMIT}).", int, 8, panel=SHAPE, commands=RUNS, file_key="k_max", ge=1, le=K_LIMIT, hint=f"use 1 ≤ K ≤ {K_LIMIT}"),
    Setting("k", "--k", "Draft lengths to measure, comma-separated (each at most 32).", str | None, None, panel=SHAPE, commands=frozenset({SIMULATE, COMPARE, EXPORT}), file_key="k", file_commands=frozenset({SIMULATE, COMPARE}), file_type=list[int], parse=_P["ks"], ge=1, le=K_LIMIT, hint="list draft lengths such as 1,2,4",
            default_by_command={SIMULATE: "1,2,4"}, show_default=False,
            help_by_command={COMPARE: "Draft length(s) to compare τ and speedup at, e.g. 4 (default: the baseline's best K); the gate judges the K where τ fell most.",
                             EXPORT: "The draft length K to export (default: the result's best K); a per-batch-size schedule is written only for the result's own K."}),
    Setting("adaptive_threshold", "--adaptive-threshold", "Also measure adaptive K: stop drafting at the first depth whose drafter confidence max q is below this.", float | None, panel=SHAPE, commands=frozenset({SIMULATE}), file_key="adaptive_threshold",
            ge=0, le=1, hint="it is a drafter confidence max q; use e.g. 0.4"),
    Setting("seeds", "--seeds", "Run the loop under this many seeds (--seed, --seed + 1, …) and pool them: more drafts behind every measured figure, each with its standard error over prompts.", int, 1,
            panel=SHAPE, commands=frozenset({SIMULATE}), file_key="seeds", ge=1, le=64, hint="use 1–64, e.g. 3"),
    Setting("verify_factor", "--verify-factor", "Override: a round costs (1 + K·c)·v target steps; default: the verify pass over K+1 tokens timed on the device for every K.", float | None, panel=COST, commands=RUNS, file_key="verify_factor",
            gt=0, hint="use e.g. 1.5, or leave it out to measure it on the device"),
    Setting("cost_ratio", "--cost-ratio", "Override: drafter/target cost per step c; default: timed on the device.", float | None, panel=COST, commands=RUNS, file_key="cost_ratio", gt=0, hint="leave it out to measure it on the device"),
    # ------------------------------------------------------------------ runtime
    Setting("device", "--device", "auto | cpu | cuda | cuda:N (auto: cuda when available).", str, "auto", panel=PAIR, commands=RUNS | {DEMO}, file_key="device", file_commands=RUNS),
    Setting("dtype", "--dtype", "auto | float32 | bfloat16 | float16 (auto: bf16 on GPU, fp32 on CPU).", str, "auto", panel=PRECISION, commands=RUNS | {DEMO}, file_key="dtype", file_commands=RUNS, choices=DTYPES),
    Setting("gguf_weights", "--gguf-weights", "A quantized GGUF's decoder weights: held keeps them as the file's ggml blocks and dequantizes each layer at every forward (a GGUF that fits only quantized; slower, about 3× a decode step on a CPU), float dequantizes the file to fp32 once (cached), auto holds them only when the fp32 weights would take more than half the memory available.",
            str, "auto", panel=SCALE, commands=RUNS | {DEMO}, file_key="gguf_weights", file_commands=RUNS, choices=("auto", "held", "float")),
    Setting("device_map", "--device-map", "Spread a target larger than one GPU over the devices with accelerate: auto | balanced | sequential | cpu.", str | None, panel=SCALE, commands=frozenset({DIAGNOSE}), file_key="device_map", show_default=False),
    Setting("max_memory", "--max-memory", "Memory per device for --device-map, e.g. 0=70GiB,1=70GiB (cpu=… too).", str | None, panel=SCALE, commands=frozenset({DIAGNOSE}), file_key="max_memory", parse=_P["max_memory"], metavar="DEV=SIZE,…", show_default=False),
    Setting(
        "target_quant", "--target-quant",
        "Serve the target quantized: fp8 (e4m3, per-output-channel scale) | fp8:per-tensor | fp8-dynamic (fp8 weights and fp8 activations per token, llm-compressor's FP8_DYNAMIC) | "
        "int8 (W8A16, per channel) | w8a8-int8 (int8 weights and int8 activations per token, llm-compressor's W8A8) | int4 (W4A16, groups of 128). "
        "Round-to-nearest onto the grid after loading, held quantized and dequantized per layer at each forward (RTN simulation, not AWQ/GPTQ calibration); the decoder layers' linear weights, not the embeddings or LM head. "
        "A self:layers=N drafter shares these weights.",
        str | None, panel=PRECISION, commands=MODELS, file_key="target_quant", choices=QUANT_SCHEMES, show_default=False,
    ),
    Setting(
        "draft_quant", "--draft-quant",
        "Serve the drafter model quantized, as --target-quant (an independent drafter model only; a self:layers=N drafter follows --target-quant).",
        str | None, panel=PRECISION, commands=MODELS, file_key="draft_quant", choices=QUANT_SCHEMES, show_default=False,
    ),
    Setting(
        "kv_cache_dtype", "--kv-cache-dtype",
        "The KV cache as served: fp8 (vLLM's --kv-cache-dtype fp8) rounds every key and value the attention reads to e4m3 (scales 1.0, vLLM's default without calibrated scales); "
        "llama.cpp's --cache-type-k/-v types f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | f32 round each head's keys and values block by block as ggml stores them (and the query as ggml's K·Q dot product converts it), K/V apart as q8_0/f16; "
        "on the target and the drafter model; auto keeps the compute dtype.",
        str | None, panel=PRECISION, commands=MODELS, file_key="kv_cache_dtype", parse=parse_kv_cache_dtype, metavar="auto|fp8|GGML_TYPE[/V_TYPE]", show_default=False,
    ),
    Setting(
        "draft_kv_cache_dtype", "--draft-kv-cache-dtype",
        "The drafter's own KV-cache dtype (vLLM's speculative_config.kv_cache_dtype, llama-server's --cache-type-k-draft/-v-draft): the values of --kv-cache-dtype; default: --kv-cache-dtype. An independent drafter model only (a self-draft shares the target's attention).",
        str | None, panel=PRECISION, commands=MODELS, file_key="draft_kv_cache_dtype", parse=parse_kv_cache_dtype, metavar="auto|fp8|GGML_TYPE[/V_TYPE]", show_default=False,
    ),
    Setting("force", "--force", "Run even when alignment errors make the numbers meaningless.", bool, False, panel=GATE, commands=RUNS, file_key="force"),
    Setting("no_cache", "--no-cache", "Regenerate on-policy references instead of reusing the disk cache.", bool, False, panel=PROMPTS, commands=RUNS, file_key="no_cache"),
    Setting("brief", "--brief", "Verdict and findings only.", bool, False, panel=OUTPUTS_PANEL, commands=frozenset({DIAGNOSE, SIMULATE, MERGE}), file_key="brief", file_commands=frozenset({DIAGNOSE, SIMULATE, MERGE}), recorded=False),
    Setting(
        "shard", "--shard",
        "Score shard I of N (whole reference batches, b % N == I) and write its part to --json; `specprobe merge` joins the parts. Under torchrun the ranks shard by themselves.",
        str | None, panel=SCALE, commands=frozenset({DIAGNOSE}), file_key="shard", parse=_P["shard"], metavar="I/N", show_default=False, recorded=False,
    ),
    # ------------------------------------------------------------------ judging and outputs
    Setting("rules", "--rules", "Extra rules YAML file(s): add rules or override/disable default ones by id.", list[Path] | None, panel=GATE, commands=MODELS | {COMPARE, MERGE, MONITOR, RULES, ALERTS}, file_key="rules", file_type=list[Path], file_commands=MODELS | {COMPARE, MERGE}, metavar="FILE"),
    Setting("fail_on", "--fail-on", "Exit 1 when a finding at or above this severity: error | warning | info | never.", str, "error", panel=GATE, commands=MODELS | {COMPARE, MERGE, MONITOR}, file_key="fail_on", file_commands=MODELS | {COMPARE, MERGE}, choices=FAIL_ON,
            default_by_command={MONITOR: "warning"}, help_by_command={SWEEP: "Exit 1 when the recommended drafter has a finding at or above this severity: error | warning | info | never."}),
    Setting("json_path", "--json", "Write the full result as JSON to this file.", str | None, panel=OUTPUTS_PANEL, commands=(MODELS - {SWEEP}) | {COMPARE, MERGE, DEMO}, file_key=_OUT + "json", file_commands=(RUNS - {SWEEP}) | {MERGE}, metavar="FILE", show_default=False, recorded=False),
    Setting("csv_dir", "--csv", "Write CSV tables (summary, per-position rows, …) into this folder.", str | None, panel=OUTPUTS_PANEL, commands=REPORTS | {SWEEP}, file_key=_OUT + "csv", file_commands=(RUNS - {SWEEP}) | {MERGE}, metavar="DIR", show_default=False, recorded=False,
            help_by_command={COMPARE: "Write the delta tables as CSV into this folder.", SWEEP: "Write the sweep table as CSV (sweep.csv: one row per drafter, τ and speedup per K) into this folder."}),
    Setting("html", "--html", "Write a self-contained HTML report (inline CSS and SVG; opens offline).", str | None, panel=OUTPUTS_PANEL, commands=REPORTS | {SWEEP}, file_key=_OUT + "html", file_commands=(RUNS - {SWEEP}) | {MERGE}, metavar="FILE", show_default=False, recorded=False,
            help_by_command={SWEEP: "Write the sweep table as a self-contained HTML page."}),
    Setting("junit", "--junit", "Write JUnit XML: one testcase per rule evaluated.", str | None, panel=OUTPUTS_PANEL, commands=REPORTS, file_key=_OUT + "junit", file_commands=(RUNS - {SWEEP}) | {MERGE}, metavar="FILE", show_default=False, recorded=False),
    Setting("markdown", "--markdown", "Write a Markdown summary (for $GITHUB_STEP_SUMMARY or a PR comment).", str | None, panel=OUTPUTS_PANEL, commands=REPORTS, file_key=_OUT + "markdown", file_commands=(RUNS - {SWEEP}) | {MERGE}, metavar="FILE", show_default=False, recorded=False),
    Setting(
        "serving_config", "--serving-config",
        "What the engine is launched with (repeatable): vLLM's --speculative-config JSON or vllm serve YAML, an SGLang launch YAML, a TensorRT-LLM "
        "speculative_config YAML, or a launch script / args file (vllm serve, sglang.launch_server, llama-server with its LLAMA_ARG_* variables, trtllm-serve). "
        "Its engine, drafting, sampling, drafter, K and KV-cache dtypes fill what neither a flag nor --config sets.",
        list[Path] | None, panel=PAIR, commands=MODELS, file_key="serving_configs", file_type=list[Path], metavar="FILE", recorded=False,
    ),
    # ------------------------------------------------------------------ export
    Setting("synthetic", "--synthetic", "Write the engine's synthetic-acceptance form (vLLM rejection_sample_method synthetic, llama-server --spec-synth-rates): the engine accepts drafts at the result's per-position rates, so a benchmark measures the speedup such a drafter would give on that hardware.", bool, False, panel=OUTPUTS_PANEL, commands=frozenset({EXPORT}), recorded=False),
    Setting("training", "--training", "Write retraining data instead of a serving config: specforge | speculators (the weakest prompts with the target's own answers, and a manifest).", str | None, panel=OUTPUTS_PANEL, commands=frozenset({EXPORT}), choices=("specforge", "speculators"), recorded=False, show_default=False),
    Setting("budget", "--budget", "--training: how many prompts to export, the weakest first.", int, 64, panel=OUTPUTS_PANEL, commands=frozenset({EXPORT}), ge=1, hint="a positive number of prompts", recorded=False),
    Setting("export_out", "--output", "Where to write: the config file (default: stdout), or the folder for --training.", Path | None, panel=OUTPUTS_PANEL, commands=frozenset({EXPORT}), declared_by_command=True, recorded=False, metavar="FILE|DIR", show_default=False),
    Setting("baseline", "BASELINE.json", "The baseline result JSON (the drafter in production).", Path | None, panel=GATE, commands=frozenset({COMPARE}), file_key="baseline", file_type=Path, declared_by_command=True, recorded=False),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
BY_FILE_KEY: dict[str, Setting] = {s.file_key: s for s in SETTINGS if s.file_key is not None}
OUTPUTS: dict[str, str] = {"json_path": "file", "csv_dir": "dir", "html": "file", "junit": "file", "markdown": "file"}  # output settings and what each names
SAMPLING = tuple(s.name for s in SETTINGS if s.serving_keys)  # the sampling settings, target side then drafter side


def for_command(command: str) -> list[Setting]:
    return [s for s in SETTINGS if command in s.commands]


# ----------------------------------------------------------------------------- the one check
def check(name: str, value: Any, where: str) -> Any:
    """A setting's value, refused (ConfigError, one line naming `where`) when it is not
    a finite number within the setting's bounds or not one of its choices. The same
    check for a flag, a probe config and a serving config. Lists are checked item by item."""
    s = BY_NAME[name]
    if value is None:
        return value
    for item in value if isinstance(value, (list, tuple)) and name != "shard" else [value]:
        _check_one(s, item, value, where)
    return value


def check_bounds(s: Setting, x: Any, where: str) -> None:
    """One value against a setting-like bound (an engine's own knob has one too, though
    no flag): the words of `check`."""
    _check_one(s, x, x, where)


def _check_one(s: Setting, x: Any, whole: Any, where: str) -> None:
    def refuse(what: str) -> ConfigError:
        return ConfigError(f"{where} {whole!r} {what}", s.hint or (f"use one of {', '.join(s.choices)}" if s.choices else "see docs/settings.md"))

    if s.choices:
        if x not in s.choices:
            raise refuse(f"is not one of {', '.join(s.choices)}")
        return
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return
    if not math.isfinite(x):
        raise refuse("is not a finite number")
    lo_ok = (s.ge is None or x >= s.ge) and (s.gt is None or x > s.gt)
    hi_ok = (s.le is None or x <= s.le) and (s.lt is None or x < s.lt)
    if lo_ok and hi_ok:
        return
    two_sided = (s.ge is not None or s.gt is not None) and (s.le is not None or s.lt is not None)
    if two_sided:
        raise refuse(f"is out of range {s.bounds_text()}" if isinstance(x, int) and s.type in (int, int | None) else f"is outside {s.bounds_text()}")
    if s.ge == 0:
        raise refuse("is negative")
    if s.gt == 0:
        raise refuse("must be positive")
    raise refuse(f"must be at least {_n(s.ge if s.ge is not None else s.gt)}")


def from_text(name: str, value: Any, where: str) -> Any:
    """A flag's value in the options' type (lists parsed, paths made), then checked."""
    s = BY_NAME[name]
    if value is None:
        return None
    if name in OUTPUTS:
        if not str(value).strip():  # --markdown "$GITHUB_STEP_SUMMARY" outside CI: never "the current folder"
            raise OutputError(f"{where} was given an empty path", "give it a file name, or leave the flag out")
        return Path(value)
    if s.parse is not None and isinstance(value, str):
        value = s.parse(value, where)
    elif isinstance(value, list) and s.file_type == list[Path]:
        value = [Path(v) for v in value]
    return check(name, value, where)


# ----------------------------------------------------------------------------- the docs table
def _type_name(tp: Any) -> str:
    args = [a for a in getattr(tp, "__args__", ()) if a is not type(None)]
    if getattr(tp, "__origin__", None) is list:
        return "list of " + _type_name(args[0])
    if args and getattr(tp, "__origin__", None) is None:  # X | None
        return " or ".join(_type_name(a) for a in args)
    return getattr(tp, "__name__", str(tp))


def markdown_table(settings: Iterable[Setting] = SETTINGS) -> str:
    """docs/settings.md: every setting, its flag, probe-config key, bounds and commands."""
    rows = [
        "# Settings",
        "",
        "Generated from `specprobe/settings/model.py` (`python -m specprobe.settings > docs/settings.md`); a test keeps it current.",
        "Every numeric value must be a finite number within its bounds, whether it is typed as a flag, written in a probe",
        "config or in a serving config; a value outside them is refused with one line naming where it was written (exit 2).",
        "",
        "| flag | probe-config key | serving-config key | type | default | bounds | commands | recorded | what it does |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in settings:
        t = _type_name(s.file_type or s.type)
        default = "" if s.default is None else f"`{s.default}`"
        extra = "; ".join(f"{c}: `{v}`" for c, v in s.default_by_command.items())
        rows.append(
            f"| `{s.flag}` | {f'`{s.file_key}`' if s.file_key else '—'} | {', '.join(f'`{k}`' for k in s.serving_keys) or '—'} | {t} | {default}{(' (' + extra + ')') if extra else ''} | {s.bounds_text() or '—'} "
            f"| {', '.join(c for c in COMMANDS if c in s.commands)} | {'yes' if s.recorded else 'no'} | {s.help.replace('|', '/')} |"
        )
    return "\n".join(rows) + "\n"
