"""Prompts: the built-in domain suite (data in `builtin.jsonl`, shipped in the wheel), the
readers for Spec-Bench/MT-Bench question files and `{"prompt", "domain"}` JSONL, and the
category → domain folding.

Layout: `sets` (the Prompt/PromptSet values, select), `readers` (files → sets),
`categories` (domains, Spec-Bench's categories and task columns)."""

from specprobe.prompts.categories import (
    CATEGORY_TO_DOMAIN,
    DEFAULT_DOMAIN,
    DOMAINS,
    MT_BENCH_CATEGORIES,
    SPEC_BENCH_CATEGORIES,
    SPEC_BENCH_TASKS,
    domain_for,
    spec_bench_task,
)
from specprobe.prompts.readers import builtin_suite, load_prompts
from specprobe.prompts.sets import Prompt, PromptSet, content_sha256, select

__all__ = [
    "CATEGORY_TO_DOMAIN",
    "DEFAULT_DOMAIN",
    "DOMAINS",
    "MT_BENCH_CATEGORIES",
    "SPEC_BENCH_CATEGORIES",
    "SPEC_BENCH_TASKS",
    "Prompt",
    "PromptSet",
    "builtin_suite",
    "content_sha256",
    "domain_for",
    "load_prompts",
    "select",
    "spec_bench_task",
]
