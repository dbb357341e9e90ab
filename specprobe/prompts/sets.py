"""Prompt values: `Prompt` (every user turn of one question, its domain and the file's own
category), `PromptSet` (an ordered, hashed collection) and `select()`.

Nothing here reads files, tokenises or touches a model; the chat template is applied
later, to the messages `Prompt.messages` builds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specprobe.core.errors import InputError
from specprobe.prompts.categories import domain_for


@dataclass(frozen=True)
class Prompt:
    """One question. `turns` holds every user turn (MT-Bench questions have two); a
    multi-turn question's later turns are asked after the model's own answers to the
    earlier ones. `category` is the file's label verbatim ("rag", "writing", …);
    `domain` is that label folded onto the report's domains. `reference` is a dataset
    response for the first turn, present only when the file gave it as text;
    `reference_shape` names a reference the file gave in another shape (ignored)."""

    id: str
    domain: str
    category: str
    turns: tuple[str, ...]
    reference: str | None = None
    reference_shape: str | None = None

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def messages(self, turn: int = 0, answers: Sequence[str] = ()) -> list[dict[str, str]]:
        """Chat messages ending with user turn `turn` (0-based): each earlier user turn
        followed by `answers[i]`, the model's own answer to it — the conversation
        Spec-Bench and MT-Bench evaluate a second turn in. Answers past `turn` are
        ignored, so the same list serves every turn."""
        if not 0 <= turn < len(self.turns):
            raise IndexError(f"prompt {self.id} has {len(self.turns)} turn(s); no turn {turn}")
        if len(answers) < turn:
            raise ValueError(f"prompt {self.id}: turn {turn} needs the answers to the {turn} turn(s) before it, got {len(answers)}")
        out: list[dict[str, str]] = []
        for i in range(turn):
            out.append({"role": "user", "content": self.turns[i]})
            out.append({"role": "assistant", "content": answers[i]})
        out.append({"role": "user", "content": self.turns[turn]})
        return out


@dataclass(frozen=True)
class PromptSet:
    """`description`: how the prompts were drawn from the file, one line ("13 of 480
    prompts, round-robin over 13 categories"), for the run's output."""

    name: str
    source: str
    prompts: tuple[Prompt, ...]
    sha256: str
    description: str = ""

    @classmethod
    def from_prompts(cls, name: str, source: str, prompts: Iterable[Prompt], description: str | None = None) -> PromptSet:
        """Build a set and compute its content hash (the one way sets are made here)."""
        items = tuple(prompts)
        if description is None:
            description = _all(len(items))
        return cls(name=name, source=source, prompts=items, sha256=content_sha256(items), description=description)

    @property
    def domains(self) -> list[str]:
        return list(dict.fromkeys(p.domain for p in self.prompts))

    @property
    def categories(self) -> list[str]:
        """The file's own categories, in order of first appearance."""
        return list(dict.fromkeys(p.category for p in self.prompts))

    @property
    def num_turns(self) -> int:
        """User turns over every prompt (a two-turn question counts twice)."""
        return sum(len(p.turns) for p in self.prompts)

    def by_domain(self) -> dict[str, list[Prompt]]:
        groups: dict[str, list[Prompt]] = {}
        for p in self.prompts:
            groups.setdefault(p.domain, []).append(p)
        return groups

    def by_category(self) -> dict[str, list[Prompt]]:
        groups: dict[str, list[Prompt]] = {}
        for p in self.prompts:
            groups.setdefault(p.category, []).append(p)
        return groups

    def require_references(self) -> None:
        """InputError unless every prompt has a text reference (what `--reference
        dataset` scores on); the message says which shapes the file used instead."""
        missing = [p for p in self.prompts if not p.reference]
        if not missing:
            return
        shapes = sorted({p.reference_shape for p in missing if p.reference_shape})
        cats = list(dict.fromkeys(p.category for p in missing))
        why = f"; the file gives {', '.join(shapes)} instead of text" if shapes else ""
        raise InputError(
            f"--reference dataset needs a text response for every prompt; {len(missing)} of {len(self.prompts)} {'has' if len(missing) == 1 else 'have'} none "
            f"(first: {missing[0].id}; categories {', '.join(cats[:5])}{', …' if len(cats) > 5 else ''}){why}",
            "give 'reference'/'response'/'answer' as text, select prompts that have one, or use the default on-policy references",
        )

    def __len__(self) -> int:
        return len(self.prompts)


def content_sha256(prompts: Iterable[Prompt]) -> str:
    """Hash of what the models actually see and are scored on. The set's name, source and
    the raw category strings are left out on purpose: the same prompts copied to another
    file, or re-labelled "coding" instead of "code", are still the same experiment."""
    canonical = [[p.id, p.domain, list(p.turns), p.reference] for p in prompts]
    blob = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _refuse_unknown(kind: str, wanted: set[str], known: set[str], available: Sequence[str], set_name: str) -> None:
    """InputError when nothing is wanted or a wanted name is none of the known ones."""
    unknown = sorted(w for w in wanted if w not in known)
    if not wanted or unknown:
        what = ", ".join(unknown) if unknown else "(none given)"
        plural = "categories" if kind == "category" else f"{kind}s"
        raise InputError(
            f"unknown {kind} {what} in prompt set {set_name} — "
            f"available: {', '.join(available)}",
            f"pick {plural} from the available list",
        )


def select(
    prompt_set: PromptSet,
    domains: list[str] | None = None,
    max_prompts: int | None = None,
    categories: list[str] | None = None,
) -> PromptSet:
    """Filter by domain and by the file's category, then cap the count. The cap takes
    prompts round-robin across the file's categories, the categories ordered
    round-robin across domains: a small N still reaches every domain, and an N as large
    as the number of categories reaches every category (Spec-Bench's 13 are not all
    MT-Bench questions). The result keeps file order and says how it was drawn."""
    available = prompt_set.domains
    prompts = list(prompt_set.prompts)
    filters: list[str] = []

    if domains is not None:
        # Requested names go through the same mapping as the file, so "coding" finds code.
        wanted = {domain_for(d) for d in domains if d.strip()}
        _refuse_unknown("domain", wanted, set(available), available, prompt_set.name)
        prompts = [p for p in prompts if p.domain in wanted]
        filters.append(f"{'domain' if len(wanted) == 1 else 'domains'} {', '.join(d for d in available if d in wanted)}")

    if categories is not None:
        # Categories are the file's own labels, matched exactly up to case.
        have = {c.lower(): c for c in prompt_set.categories}
        wanted_c = {c.strip().lower() for c in categories if c.strip()}
        _refuse_unknown("category", wanted_c, set(have), prompt_set.categories, prompt_set.name)
        prompts = [p for p in prompts if p.category.lower() in wanted_c]
        filters.append(f"{'category' if len(wanted_c) == 1 else 'categories'} {', '.join(c for c in prompt_set.categories if c.lower() in wanted_c)}")

    how = ""
    if max_prompts is not None:
        if isinstance(max_prompts, bool) or not isinstance(max_prompts, int) or max_prompts < 1:
            raise InputError(
                f"max prompts must be a positive integer, got {max_prompts!r}",
                "pass a number of prompts of 1 or more",
            )
        if max_prompts < len(prompts):
            groups = _interleaved_groups(prompts)
            chosen: list[int] = []
            rank = 0
            while len(chosen) < max_prompts:
                for idx in groups:
                    if rank < len(idx) and len(chosen) < max_prompts:
                        chosen.append(idx[rank])
                rank += 1
            has_categories = any(p.category != p.domain for p in prompts)
            how = f", round-robin over {len(groups)} {'categories' if has_categories else 'domains'}" if len(groups) > 1 else ""
            prompts = [prompts[i] for i in sorted(chosen)]

    if not prompts:
        raise InputError(
            f"empty prompt set after selection from {prompt_set.name}",
            f"available domains: {', '.join(available)}",
        )
    total = len(prompt_set.prompts)
    drawn = _all(total) if len(prompts) == total else f"{len(prompts)} of {_count(total)}"
    where = f" ({'; '.join(filters)})" if filters else ""
    return PromptSet.from_prompts(prompt_set.name, prompt_set.source, prompts, description=drawn + where + how)


def _interleaved_groups(prompts: Sequence[Prompt]) -> list[list[int]]:
    """Indices of `prompts` by category (file order within each), the categories taken
    round-robin over their domains: writing, reasoning, coding, extraction, translation,
    summarization, then roleplay, math, stem, … for Spec-Bench's question file."""
    by_domain: dict[str, dict[str, list[int]]] = {}
    for i, p in enumerate(prompts):
        by_domain.setdefault(p.domain, {}).setdefault(p.category, []).append(i)
    columns = [list(cats.values()) for cats in by_domain.values()]
    out: list[list[int]] = []
    for rank in range(max((len(c) for c in columns), default=0)):
        out.extend(c[rank] for c in columns if rank < len(c))
    return out


def _count(n: int) -> str:
    return f"{n} prompt" if n == 1 else f"{n} prompts"


def _all(n: int) -> str:
    return "1 prompt" if n == 1 else f"all {n} prompts"
