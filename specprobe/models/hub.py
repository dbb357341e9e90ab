"""Hugging Face repo ids as model and drafter specs: the cached snapshot when the hub cache
holds it, else a download with `huggingface_hub` (its progress bars, its resumable
downloads, HF_TOKEN for a gated or private repo, HF_ENDPOINT for a mirror).

A snapshot already in the cache is used as it is, with no network call (the revision
refs/<revision> names, or refs/main); one the hub client left incomplete (its cached
file listing names a wanted file that is missing) is downloaded again, which resumes.
`--offline` or HF_HUB_OFFLINE=1 forbids downloads: a repo not in the cache is then an
error that says how to allow them.

Only what specprobe reads is downloaded (`wanted`): the top-level JSON files (config,
generation config, tokenizer, weight index), the tokenizer's other files, and one set of
weights — the safetensors, else the PyTorch .bin / .pt files (an EAGLE or Medusa head's),
else a lone .gguf — never the repo's sub-folders (`original/`, other quantizations)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from specprobe.core.errors import ModelLoadError

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = {"1", "ON", "YES", "TRUE"}  # as huggingface_hub reads its boolean variables
# the tokenizer's files beside the JSON ones (sentencepiece, tiktoken, BPE)
_TOKENIZER = ("*.model", "*.tiktoken", "merges.txt", "vocab.txt")


# ----------------------------------------------------------------------------- the cache on disk
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_cache() -> Path:
    """The Hugging Face hub cache, found as huggingface_hub finds it: HF_HUB_CACHE (or
    the older HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def hub_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of `org/name` (models--org--name/snapshots/<rev>, the revision
    refs/main points to), read from disk only; None when it is not in the cache. A
    cache without refs/main (a snapshot downloaded by revision) is used when it holds
    exactly one snapshot, since that one is all an offline run could load."""
    if not REPO_ID.match(repo_id):
        return None
    repo = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8").strip()
        folder = snapshots / rev
        return folder if rev and folder.is_dir() else None
    found = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
    return found[0] if len(found) == 1 else None


def snapshot_repo(folder: Path) -> str | None:
    """The model's name for a folder inside the hub cache (…/models--org--name/snapshots/<rev>),
    whose own name is a revision hash."""
    parts = folder.expanduser().absolute().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].split("--")[-1]
    return None



def offline_by_env() -> str | None:
    """The variable that turns the hub off (HF_HUB_OFFLINE, or transformers' older
    TRANSFORMERS_OFFLINE), read now: huggingface_hub reads it once, at import."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in _TRUE:
            return var
    return None


def wanted(files: Iterable[str]) -> list[str]:
    """The repo's files specprobe reads (top level only): JSON, tokenizer files and one set
    of weights, as the module's docstring says."""
    top = [f for f in files if "/" not in f]
    keep = [f for f in top if f.endswith(".json") or any(fnmatch(f, p) for p in _TOKENIZER)]
    safetensors = [f for f in top if f.endswith(".safetensors")]
    # a repo with transformers' shards and a consolidated copy (Mistral's): the shards
    sharded = [f for f in safetensors if f.startswith("model")]
    torch_files = [f for f in top if f.endswith((".bin", ".pt"))]
    ggufs = [f for f in top if f.endswith(".gguf")]
    if safetensors:
        keep += sharded or safetensors
    elif torch_files:
        keep += torch_files
    elif len(ggufs) == 1:
        keep += ggufs
    return sorted(set(keep))


def cached_snapshot(repo_id: str, revision: str | None, cache: Path) -> Path | None:
    """The snapshot folder the cache holds for `revision` (None: main), from disk only."""
    revision = revision or "main"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    if _COMMIT.match(revision) and (repo / "snapshots" / revision).is_dir():
        return repo / "snapshots" / revision
    ref = repo / "refs" / revision
    if ref.is_file():
        folder = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
        return folder if folder.is_dir() else None
    return None


def missing_files(repo_id: str, revision: str | None, cache: Path, snap: Path) -> list[str]:
    """Wanted files the hub client's cached listing of this snapshot names and the folder
    lacks (an interrupted download); none when it kept no listing (an older client)."""
    from huggingface_hub import get_cached_repo_tree

    try:
        tree = get_cached_repo_tree(repo_id, revision=snap.name, cache_dir=str(cache))
    except Exception:  # no listing kept (CachedRepoTreeNotFoundError), or one not readable: trust the folder
        return []
    return [f for f in wanted(e.path for e in tree) if not (snap / f).is_file()]


def _endpoint() -> str | None:
    # read now, not at huggingface_hub's import: a mirror set after it still counts
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or None


def _where(repo_id: str, revision: str | None) -> str:
    return f"{repo_id}" + (f" (revision {revision})" if revision else "")


def refused_offline(repo_id: str, revision: str | None, cache: Path, offline_flag: bool, incomplete: list[str] | None = None) -> ModelLoadError:
    by = "--offline" if offline_flag else f"{offline_by_env()}=1"
    allow = "drop --offline" if offline_flag else f"unset {offline_by_env()}"
    what = (
        f"the cached {_where(repo_id, revision)} misses {', '.join(incomplete[:3])}"
        if incomplete
        else f"model path {repo_id} does not exist, and the Hugging Face cache {cache} holds no {'models--' + repo_id.replace('/', '--')}"
        + (f" at revision {revision}" if revision else " with a snapshot refs/main points to")
    )
    return ModelLoadError(f"{what}; downloads are off ({by})", f"{allow} to let specprobe download it, or download it where there is a network (hf download {repo_id})")


def _status(e: BaseException) -> int | None:
    response = getattr(e, "response", None)
    return getattr(response, "status_code", None)


def download_error(repo_id: str, revision: str | None, e: BaseException) -> ModelLoadError:
    """The hub client's error as one line naming the repo: 401/403 (gated, private or a
    bad token), 404 (no such repo or revision), the hub out of reach, anything else."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = _endpoint() or "https://huggingface.co"
    status = _status(e)
    if isinstance(e, GatedRepoError) or status in (401, 403):
        return ModelLoadError(
            f"{_where(repo_id, revision)} refused the download ({status or 'gated'}): the repo is gated or private, or the token is not allowed",
            f"set HF_TOKEN to a token of an account that has accepted the licence on {endpoint}/{repo_id} (or run hf auth login)",
        )
    if isinstance(e, RevisionNotFoundError):
        return ModelLoadError(f"revision {revision} not found in {repo_id} on {endpoint}", "check the branch, tag or commit given with --revision / --draft-revision")
    if isinstance(e, RepositoryNotFoundError) or status == 404:
        return ModelLoadError(f"{_where(repo_id, revision)} not found on {endpoint} (404)", "check the repo id (org/name), or pass a local folder")
    if isinstance(e, LocalEntryNotFoundError):  # the hub out of reach, and nothing cached
        return ModelLoadError(f"cannot download {_where(repo_id, revision)}: {endpoint} cannot be reached", "check the network (or HF_ENDPOINT), or use --offline with a cached copy")
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    kind = f"HTTP {status}" if isinstance(e, HfHubHTTPError) and status else type(e).__name__
    return ModelLoadError(f"downloading {_where(repo_id, revision)} failed ({kind}): {first}", "try again (a download resumes where it stopped); check the network or HF_ENDPOINT")


@contextmanager
def _progress_bars() -> Iterator[None]:
    """The hub client's progress bars on for the download, unless the user turned them
    off (HF_HUB_DISABLE_PROGRESS_BARS); transformers' `disable_progress_bar`, which the
    loader calls to quiet model loading, turns them off for the process."""
    from huggingface_hub import constants
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    user_off = constants.HF_HUB_DISABLE_PROGRESS_BARS is True or os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().upper() in _TRUE
    if are_progress_bars_disabled() and not user_off:
        enable_progress_bars()
        try:
            yield
        finally:
            disable_progress_bars()
    else:
        yield


def download(repo_id: str, revision: str | None, cache: Path, progress: Any = None) -> Path:
    """The repo's wanted files downloaded into the hub cache; its snapshot folder."""
    from huggingface_hub import HfApi, snapshot_download

    endpoint = _endpoint()
    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision)
        files = wanted(s.rfilename for s in info.siblings or [])
        if not files:
            raise ModelLoadError(f"{_where(repo_id, revision)} holds no config.json, weights or tokenizer at its top level", "pass the repo of a transformers checkpoint, a head, or one .gguf file")
        if progress:
            progress(f"downloading {_where(repo_id, revision)} ({len(files)} files) into {cache}")
        with _progress_bars():
            # the revision as given (not the commit it resolves to): the cache's refs/<revision> is written
            folder = snapshot_download(repo_id, revision=revision, cache_dir=str(cache), allow_patterns=files, endpoint=endpoint)
    except ModelLoadError:
        raise
    except Exception as e:  # the hub client's errors (huggingface_hub.errors), network and OS errors
        raise download_error(repo_id, revision, e) from e
    return Path(folder)


def fetch(repo_id: str, revision: str | None = None, offline: bool = False, progress: Any = None) -> Path:
    """The local snapshot folder of `repo_id` at `revision` (None: main): the cached one
    (no network call), else downloaded, unless downloads are off."""
    cache = hub_cache()
    off = offline or offline_by_env()
    snap = cached_snapshot(repo_id, revision, cache)
    if snap is None and revision is None and off:  # offline, a lone snapshot with no refs/main is all there is (hub_snapshot)
        snap = hub_snapshot(repo_id)
    missing = missing_files(repo_id, revision, cache, snap) if snap is not None else []
    if snap is not None and not missing:
        return snap
    if off:
        raise refused_offline(repo_id, revision, cache, offline, missing or None)
    return download(repo_id, revision, cache, progress)
