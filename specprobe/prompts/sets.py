"""Prompt sets: the `Prompt`/`PromptSet` values, the built-in suite, the JSONL readers and
`select()`. Nothing here tokenises or touches a model; the chat template is applied later."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from specprobe.errors import InputError

DOMAINS = ("code", "math", "chat", "summarization", "translation", "qa")

# Spec-Bench and MT-Bench categories onto our domains. A category missing from this
# table is kept as its own (lower-cased) domain rather than rejected: a user's own
# label such as "legal" is still a useful slice of the report.
CATEGORY_TO_DOMAIN = {
    "code": "code",
    "coding": "code",
    "math": "math",
    "math_reasoning": "math",
    "reasoning": "math",
    "chat": "chat",
    "writing": "chat",
    "roleplay": "chat",
    "humanities": "chat",
    "summarization": "summarization",
    "translation": "translation",
    "qa": "qa",
    "rag": "qa",
    "extraction": "qa",
    "stem": "qa",
}

# Used when a `{"prompt": ...}` line names no domain at all.
DEFAULT_DOMAIN = "general"

# Keys that may carry a dataset response in the `{"prompt": ...}` format, in priority order.
_REFERENCE_KEYS = ("reference", "response", "answer")

_BUILTIN_RESOURCE = "builtin.jsonl"


@dataclass(frozen=True)
class Prompt:
    id: str
    domain: str
    category: str
    turns: tuple[str, ...]
    reference: str | None = None


@dataclass(frozen=True)
class PromptSet:
    name: str
    source: str
    prompts: tuple[Prompt, ...]
    sha256: str

    @classmethod
    def from_prompts(cls, name: str, source: str, prompts: Iterable[Prompt]) -> PromptSet:
        """Build a set and compute its content hash (the one way sets are made here)."""
        items = tuple(prompts)
        return cls(name=name, source=source, prompts=items, sha256=content_sha256(items))

    @property
    def domains(self) -> list[str]:
        return list(dict.fromkeys(p.domain for p in self.prompts))

    def by_domain(self) -> dict[str, list[Prompt]]:
        groups: dict[str, list[Prompt]] = {}
        for p in self.prompts:
            groups.setdefault(p.domain, []).append(p)
        return groups

    def __len__(self) -> int:
        return len(self.prompts)


def content_sha256(prompts: Iterable[Prompt]) -> str:
    """Hash of what the models actually see and are scored on. The set's name, source and
    the raw category strings are left out on purpose: the same prompts copied to another
    file, or re-labelled "coding" instead of "code", are still the same experiment."""
    canonical = [[p.id, p.domain, list(p.turns), p.reference] for p in prompts]
    blob = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def domain_for(category: str) -> str:
    """Map an engine's category (or a user's domain name) onto DOMAINS, else keep it."""
    key = category.strip().lower()
    return CATEGORY_TO_DOMAIN.get(key, key)


@functools.lru_cache(maxsize=1)
def builtin_suite() -> PromptSet:
    """The suite shipped inside the package: 10 single-turn prompts in each of DOMAINS."""
    text = resources.files("specprobe.prompts").joinpath(_BUILTIN_RESOURCE).read_text("utf-8")
    prompts = _parse_lines(text, display=f"<builtin {_BUILTIN_RESOURCE}>")
    return PromptSet.from_prompts("builtin", "builtin", prompts)


def load_prompts(path: str | Path) -> PromptSet:
    """Read a JSONL prompts file in Spec-Bench/MT-Bench question format
    (`question_id`, `category`, `turns`, optional `reference`) or `{"prompt", "domain"}`
    lines; the two may be mixed. Raises InputError naming the file and line."""
    p = Path(path).expanduser()
    display = str(path)
    if not p.exists():
        raise InputError(
            f"prompts file {display} does not exist",
            "check the path, or leave out --prompts to use the built-in suite",
        )
    if p.is_dir():
        raise InputError(
            f"prompts file {display} is a directory",
            "pass a .jsonl file with one prompt per line",
        )
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(
            f"prompts file {display} cannot be read: {e.strerror or e}",
            "check the file's permissions",
        ) from e
    # A BOM is common in files saved by Windows editors; it is not part of line 1's JSON.
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InputError(
            f"{display}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})",
            "save the file as UTF-8",
        ) from e
    prompts = _parse_lines(text, display=display)
    return PromptSet.from_prompts(p.name, str(p.resolve()), prompts)


def select(
    prompt_set: PromptSet,
    domains: list[str] | None = None,
    max_prompts: int | None = None,
) -> PromptSet:
    """Filter by domain, then cap the count. The cap takes prompts round-robin across
    domains so that a small N still covers every domain; the result keeps file order."""
    available = prompt_set.domains
    prompts = list(prompt_set.prompts)

    if domains is not None:
        # Requested names go through the same mapping as the file, so "coding" finds code.
        wanted = {domain_for(d) for d in domains if d.strip()}
        unknown = sorted(w for w in wanted if w not in available)
        if not wanted or unknown:
            what = ", ".join(unknown) if unknown else "(none given)"
            raise InputError(
                f"unknown domain {what} in prompt set {prompt_set.name} — "
                f"available: {', '.join(available)}",
                "pick domains from the available list",
            )
        prompts = [p for p in prompts if p.domain in wanted]

    if max_prompts is not None:
        if isinstance(max_prompts, bool) or not isinstance(max_prompts, int) or max_prompts < 1:
            raise InputError(
                f"max prompts must be a positive integer, got {max_prompts!r}",
                "pass a number of prompts of 1 or more",
            )
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(p.domain, []).append(i)
        chosen: list[int] = []
        rank = 0
        while len(chosen) < max_prompts and len(chosen) < len(prompts):
            for idx in groups.values():
                if rank < len(idx) and len(chosen) < max_prompts:
                    chosen.append(idx[rank])
            rank += 1
        prompts = [prompts[i] for i in sorted(chosen)]

    if not prompts:
        raise InputError(
            f"empty prompt set after selection from {prompt_set.name}",
            f"available domains: {', '.join(available)}",
        )
    return PromptSet.from_prompts(prompt_set.name, prompt_set.source, prompts)


# ---------------------------------------------------------------------------- parsing


def _parse_lines(text: str, display: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    # Split on "\n" only: str.splitlines() would also split on U+2028 and friends, which
    # JSON allows unescaped inside strings, and would then report the wrong line.
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.strip()
        if not line:
            continue
        prompt = _parse_record(line, lineno, display)
        if prompt.id in seen:
            raise InputError(
                f"{display}:{lineno}: duplicate id {prompt.id!r} (first on line {seen[prompt.id]})",
                "give every prompt a unique id / question_id",
            )
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise InputError(
            f"{display}: empty prompt set (no prompt lines in the file)",
            'add JSONL lines such as {"prompt": "...", "domain": "chat"}',
        )
    return prompts


def _parse_record(line: str, lineno: int, display: str) -> Prompt:
    where = f"{display}:{lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{where}: not valid JSON ({e.msg} at column {e.colno})",
            "each line must be one JSON object",
        ) from e
    if not isinstance(obj, dict):
        raise InputError(
            f"{where}: not a JSON object (got {type(obj).__name__})",
            'each line must be an object such as {"prompt": "...", "domain": "chat"}',
        )

    if "turns" in obj:
        turns = _turns(obj["turns"], where)
        raw_id = obj.get("question_id", obj.get("id"))
        category = _category(obj.get("category", obj.get("domain")), where)
        reference = _reference(obj.get("reference"), "reference", where)
    elif "prompt" in obj:
        text = obj["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise InputError(
                f"{where}: `prompt` must be a non-empty string",
                "put the user's message text under `prompt`",
            )
        turns = (text,)
        raw_id = obj.get("id", obj.get("question_id"))
        category = _category(obj.get("domain", obj.get("category")), where)
        reference = None
        for key in _REFERENCE_KEYS:
            if obj.get(key) is not None:
                reference = _reference(obj[key], key, where)
                break
    else:
        raise InputError(
            f"{where}: no prompt text (neither `turns` nor `prompt`)",
            'use {"question_id": 1, "category": "writing", "turns": ["..."]} '
            'or {"prompt": "...", "domain": "chat"}',
        )

    return Prompt(
        id=_prompt_id(raw_id, lineno, where),
        domain=domain_for(category) if category else DEFAULT_DOMAIN,
        category=category or DEFAULT_DOMAIN,
        turns=turns,
        reference=reference,
    )


def _turns(value: Any, where: str) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(t, str) and t.strip() for t in value)
    ):
        raise InputError(
            f"{where}: `turns` must be a list of non-empty strings",
            'write the user turns as ["first message", "follow-up"]',
        )
    return tuple(value)


def _category(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(
            f"{where}: category/domain must be a string, got {type(value).__name__}",
            f"use one of: {', '.join(DOMAINS)}",
        )
    return value.strip()


def _reference(value: Any, key: str, where: str) -> str | None:
    # MT-Bench stores one reference per turn as a list; the first answers the first turn,
    # which is the one off-policy scoring continues.
    if value is None:
        return None
    if isinstance(value, list):
        if not value:
            return None
        value = value[0]
    if not isinstance(value, str):
        raise InputError(
            f"{where}: `{key}` must be a string or a list of strings",
            "give the dataset response as text",
        )
    return value if value.strip() else None


def _prompt_id(value: Any, lineno: int, where: str) -> str:
    if value is None:
        # Line numbers are unique within a file, so a file without ids still loads.
        return f"line-{lineno}"
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip():
        raise InputError(
            f"{where}: id must be a non-empty string or an integer, got {value!r}",
            "give every prompt a unique id / question_id",
        )
    return str(value).strip()
