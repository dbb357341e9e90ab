"""Serving configs that run an n-gram drafter: the drafter spec specprobe reads off them
(vLLM's method ngram with prompt_lookup_min/max and K, llama-server's --spec-type ngram-*
lists with their --spec-ngram-* knobs), and what it does not implement named as nothing
(vLLM's method suffix: tests/test_ngram_suffix.py; SGLang's NGRAM: tests/test_ngram_sglang.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specprobe.core.errors import ConfigError
from specprobe.drafters.ngram import NgramDrafter
from tests.helpers import read_serving_text


@pytest.mark.parametrize(
    ("name", "text", "spec"),
    [
        # vLLM's ngram and suffix, llama.cpp's n-gram types, SGLang's NGRAM tree
        ("v.json", '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}', "ngram:max=3,k=4"),
        ("v2.json", '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}', "ngram:min=2,max=4,k=5"),
        ("v.sh", "vllm serve org/m --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'\n", "ngram:k=3"),
        ("l.sh", "llama-server -m t.gguf --spec-type ngram-map-k,ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-map-k-min-hits 2\n", "ngram-map-k:min_hits=2,ngram-simple:size_n=4"),
        ("l2.sh", "LLAMA_ARG_SPEC_TYPE=ngram-mod llama-server -m t.gguf --spec-ngram-mod-n-match 16 --spec-ngram-mod-n-min 8\n", "ngram-mod:n_match=16,n_min=8"),
        ("l3.sh", "llama-server -m t.gguf --spec-type ngram-cache\n", "ngram-cache"),
        ("l4.sh", "llama-server -m t.gguf --spec-default\n", "ngram-mod"),
        ("s.json", '{"method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 16, "suffix_decoding_min_token_prob": 0.2}', "suffix:max_tree_depth=16,min_token_prob=0.2,k=6"),
        ("s.sh", "vllm serve org/m --speculative-config '{\"method\": \"suffix\", \"suffix_decoding_max_spec_factor\": 2}'\n", "suffix:max_spec_factor=2"),
        ("g.yaml", "model-path: t\nspeculative-algorithm: NGRAM\n", "sglang-ngram"),
        ("g2.yaml", "model-path: t\nspeculative-algorithm: NGRAM\nspeculative-num-draft-tokens: 8\nspeculative-ngram-match-type: prob\nspeculative-ngram-branch-length: 14\n", "sglang-ngram:match_type=PROB,branch_length=14,num_draft_tokens=8"),
        ("g.sh", "python -m sglang.launch_server --model-path t --speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 4 --speculative-ngram-min-match-window-size 2\n", "sglang-ngram:min_match_window_size=2,max_bfs_breadth=4"),
    ],
)
def test_ngram_drafter_spec_from_serving_config(tmp_path: Path, name: str, text: str, spec: str) -> None:
    sv = read_serving_text(tmp_path, name, text)
    assert sv.drafter_spec == spec
    d = NgramDrafter(sv.drafter_spec)  # and specprobe runs it
    if spec.startswith("sglang-ngram"):
        assert sv.engine == "sglang" and d.is_tree


def test_engine_order_and_knobs_survive_the_round_trip(tmp_path: Path) -> None:
    sv = read_serving_text(tmp_path, "l.sh", "llama-server -m t.gguf --spec-type ngram-mod,ngram-simple --spec-ngram-simple-size-m 8\n")
    d = NgramDrafter(sv.drafter_spec)
    assert [t.name for t in d.types] == ["ngram-simple", "ngram-mod"]  # llama.cpp's priority
    assert d.types[0].get("size_m") == 8 and d.max_draft() == 64


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("v3.json", '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3}'),  # a model drafter (beside n-gram types: tests/test_ngram_mix.py)
    ],
)
def test_what_is_not_an_ngram_spec(tmp_path: Path, name: str, text: str) -> None:
    sv = read_serving_text(tmp_path, name, text)
    assert sv.drafter_spec is None or not sv.drafter_spec.startswith("ngram")


def test_bad_llama_ngram_knob_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="l.sh: --spec-ngram-simple-size-n 0"):
        read_serving_text(tmp_path, "l.sh", "llama-server -m t.gguf --spec-type ngram-simple --spec-ngram-simple-size-n 0\n")
