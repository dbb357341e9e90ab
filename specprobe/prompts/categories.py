"""Names for slices of a prompt set: the six domains specprobe reports on, how a file's
own categories (Spec-Bench's 13, MT-Bench's 8, or a user's labels) fold onto them, and
Spec-Bench's six task columns so results can be read against Spec-Bench's own table.

Folding is for the per-domain view only: every prompt also keeps its file's category
verbatim (`Prompt.category`), so nothing here loses information.
"""

from __future__ import annotations

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

# Used when a line names neither a category nor a domain.
DEFAULT_DOMAIN = "general"

# MT-Bench's eight categories, in MT-Bench's order.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")

# Spec-Bench's table has one column per task; its question file labels each line with
# one of 13 categories (the eight MT-Bench ones make up the multi-turn task).
SPEC_BENCH_TASKS: dict[str, tuple[str, ...]] = {
    "mt_bench": MT_BENCH_CATEGORIES,
    "translation": ("translation",),
    "summarization": ("summarization",),
    "qa": ("qa",),
    "math_reasoning": ("math_reasoning",),
    "rag": ("rag",),
}
SPEC_BENCH_CATEGORIES = tuple(c for cats in SPEC_BENCH_TASKS.values() for c in cats)

# Some copies of the MT-Bench questions prefix the category ("mt_bench_writing").
_PREFIXES = ("mt_bench_", "mt-bench-", "mtbench_")


def _normal(category: str) -> str:
    key = category.strip().lower()
    for prefix in _PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            return key[len(prefix) :]
    return key


def domain_for(category: str) -> str:
    """Map a file's category (or a user's domain name) onto DOMAINS, else keep it
    lower-cased as its own domain."""
    key = _normal(category)
    return CATEGORY_TO_DOMAIN.get(key, key)


def spec_bench_task(category: str) -> str | None:
    """The Spec-Bench table column a category belongs to ("mt_bench", "translation",
    "summarization", "qa", "math_reasoning", "rag"), or None for other labels."""
    key = _normal(category)
    for task, cats in SPEC_BENCH_TASKS.items():
        if key in cats:
            return task
    return None
