"""Prompts: the built-in domain suite (data in `builtin.jsonl`, shipped in the wheel) and
the readers for Spec-Bench/MT-Bench question files and `{"prompt", "domain"}` JSONL."""

from specprobe.prompts.sets import (
    CATEGORY_TO_DOMAIN,
    DEFAULT_DOMAIN,
    DOMAINS,
    Prompt,
    PromptSet,
    builtin_suite,
    content_sha256,
    domain_for,
    load_prompts,
    select,
)

__all__ = [
    "CATEGORY_TO_DOMAIN",
    "DEFAULT_DOMAIN",
    "DOMAINS",
    "Prompt",
    "PromptSet",
    "builtin_suite",
    "content_sha256",
    "domain_for",
    "load_prompts",
    "select",
]
