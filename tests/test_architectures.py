"""Every distribution comes out of the model's own forward, for any architecture
AutoModelForCausalLM loads: a matrix of tiny random checkpoints written to disk (Llama,
Qwen2/3, Mistral, Gemma-2/3 with soft-capping on, GPT-2, GPT-NeoX, Phi-3, Granite with
logit scaling, OLMo, Cohere with logit scale, Falcon), each through check, diagnose and
the speculative loop, compared with transformers' own forward and generate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.tiny import _tokenizer, base_vocab, prompts_file


def _vocab() -> dict[str, int]:
    """The tiny word vocabulary plus single characters: transformers 5 swaps in the
    architecture's own tokenizer class for some model types (Qwen2, GPT-2, …), which
    rebuilds a byte-level tokenizer from the vocabulary and splits "w12" into characters;
    with the characters present every class still tokenizes the prompts."""
    vocab = base_vocab()
    for ch in ["w", "Ġ", *"0123456789"]:
        vocab.setdefault(ch, len(vocab))
    return vocab


V = len(_vocab())
_SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4}
_SPECIAL = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "vocab_size": V, "max_position_embeddings": 256}


def _configs() -> dict[str, Any]:
    import transformers as T

    kv = {"num_key_value_heads": 2}
    return {
        "llama": lambda: T.LlamaConfig(**_SIZES, **kv, **_SPECIAL),
        "qwen2": lambda: T.Qwen2Config(**_SIZES, **kv, **_SPECIAL),
        "qwen3": lambda: T.Qwen3Config(**_SIZES, **kv, head_dim=8, **_SPECIAL),
        "mistral": lambda: T.MistralConfig(**_SIZES, **kv, **_SPECIAL),
        "gemma2": lambda: T.Gemma2Config(**_SIZES, **kv, head_dim=8, final_logit_softcapping=3.0, **_SPECIAL),
        "gemma3": lambda: T.Gemma3TextConfig(**_SIZES, **kv, head_dim=8, final_logit_softcapping=3.0, **_SPECIAL),
        "gpt2": lambda: T.GPT2Config(n_embd=32, n_layer=3, n_head=4, n_positions=256, vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=3),
        "gpt_neox": lambda: T.GPTNeoXConfig(**_SIZES, **_SPECIAL),
        "phi3": lambda: T.Phi3Config(**_SIZES, **kv, **_SPECIAL),
        "granite": lambda: T.GraniteConfig(**_SIZES, **kv, logits_scaling=4.0, **_SPECIAL),
        "olmo": lambda: T.OlmoConfig(**_SIZES, **_SPECIAL),
        "cohere": lambda: T.CohereConfig(**_SIZES, **kv, logit_scale=0.5, **_SPECIAL),
        "falcon": lambda: T.FalconConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, **_SPECIAL),
    }


ARCHS = list(_configs())


@pytest.fixture(scope="module")
def arch_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("archs")
    tok = _tokenizer(_vocab())
    out = {}
    for name, make in _configs().items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(make()).eval()
        with torch.no_grad():
            w = model.get_output_embeddings().weight
            # peaked distributions (random init is near uniform), untied from the embedding
            model.get_output_embeddings().weight = torch.nn.Parameter(w * (6.0 / w.std()))
        model.config.tie_word_embeddings = False
        path = root / name
        model.save_pretrained(path, safe_serialization=True)
        tok.save_pretrained(path)
        out[name] = path
    return out


def _prompts(tmp_path: Path) -> Path:
    return prompts_file(tmp_path / "prompts.jsonl", n=3, words=6)


def _get(result: Any, *keys: str) -> Any:
    for k in keys:
        result = result[k] if isinstance(result, dict) else getattr(result, k)
    return result


@pytest.mark.parametrize("arch", ARCHS)
def test_check_and_identical_pair(arch: str, arch_dir: dict[str, Path], tmp_path: Path) -> None:
    """The same checkpoint as target and as an independent drafter: α = 1, KL = 0."""
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig

    path = str(arch_dir[arch])
    r = run_diagnose(DiagnoseConfig(target=path, drafter=path, prompts=str(_prompts(tmp_path)), max_new_tokens=6, batch_size=2, k_max=2, cost_ratio=0.1))
    metrics = _get(r, "metrics")
    assert _get(r, "scored") is True
    assert metrics["accept_prob_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["kl_target_draft_nats"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["num_positions"] > 0


def _dataset_prompts(tmp_path: Path) -> Path:
    import json

    from tests.helpers.tiny import WORDS

    lines = []
    for i in range(3):
        text = " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(5))
        answer = " ".join(WORDS[(i * 11 + 3 * j) % len(WORDS)] for j in range(7))
        lines.append(json.dumps({"id": f"d{i}", "prompt": text, "response": answer, "domain": "chat"}))
    path = tmp_path / "with_answers.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _encode(tok: Any, prompt: Any) -> list[int]:
    try:
        from specprobe.probe.references import encode_prompt  # type: ignore[attr-defined,unused-ignore]
    except ImportError:  # before the pipeline's split into rooms
        from specprobe.probe.diagnose import encode_prompt  # type: ignore[attr-defined,no-redef,unused-ignore]
    return list(encode_prompt(tok, prompt))


@pytest.mark.parametrize("arch", ARCHS)
def test_alpha_equals_alpha_from_the_models_own_forward(arch: str, arch_dir: dict[str, Path], tmp_path: Path) -> None:
    """α per position from diagnose (a 2-of-3-layer self-draft at T = 1) equals α computed
    from the logits of transformers' own forward: the target's and the truncated model's."""
    from specprobe.models.anatomy import layer_view
    from specprobe.models.loader import load_model
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.prompts import load_prompts
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags

    path = str(arch_dir[arch])
    pf = _dataset_prompts(tmp_path)
    cfg = DiagnoseConfig(target=path, drafter="self:layers=2", prompts=str(pf), reference="dataset", max_new_tokens=6, batch_size=2, k_max=2, cost_ratio=0.1, sampling=SamplingFlags(temperature=1.0))
    r = run_diagnose(cfg)
    rows = _get(r, "positions")
    rows = rows if isinstance(rows, dict) else rows.model_dump()
    target = load_model(path)
    draft = layer_view(target.model, 2)
    tok = target.tokenizer
    checked = 0
    for p in load_prompts(str(pf)).prompts:
        enc = _encode(tok, p)
        ref = tok(p.reference, add_special_tokens=False)["input_ids"][:6]
        ids = torch.tensor([enc + ref])
        with torch.inference_mode():
            pt = torch.softmax(target.model(input_ids=ids).logits[0].float(), -1)  # [S, V]
            qt = torch.softmax(draft(input_ids=ids).logits[0].float(), -1)
        for pid, pos, a in zip(rows["prompt_id"], rows["position"], rows["accept_prob"], strict=True):
            if pid != p.id:
                continue
            want = float(torch.minimum(pt[pos - 1], qt[pos - 1]).sum())  # position t is predicted at t − 1
            assert a == pytest.approx(want, abs=1e-5), (arch, pid, pos)
            checked += 1
    assert checked == _get(r, "metrics")["num_positions"] > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_loop_greedy_is_token_identical_to_generate(arch: str, arch_dir: dict[str, Path]) -> None:
    """A 2-layer self-draft, K = 3, greedy, batched: the output equals transformers'
    greedy generate of the target token for token."""
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.anatomy import layer_view
    from specprobe.models.loader import load_model
    from specprobe.simulate import speculate

    target = load_model(str(arch_dir[arch]))
    step = layer_view(target.model, 2)
    prompts = [[1, 10, 11, 12, 13], [1, 40, 41], [1, 7, 8, 9, 100, 101, 102]]
    run = speculate(target.model, step, prompts, k=3, target_sampling=Sampling(temperature=0.0), max_new_tokens=10, batch_size=3)
    for prompt, got in zip(prompts, run.outputs, strict=True):
        with torch.inference_mode():
            ref = target.model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=3)
        assert got == ref[0, len(prompt) :].tolist()[: len(got)]
        assert len(got) == 10
    assert run.counters.num_drafts > 0


def test_a_head_that_misses_the_post_transform_is_refused(arch_dir: dict[str, Path]) -> None:
    """Gemma-2's forward soft-caps its logits; a head without the cap is caught by the
    check against the forward, with a one-line error naming the model."""
    from specprobe.core.errors import ModelLoadError
    from specprobe.models import anatomy
    from specprobe.models.loader import load_model

    target = load_model(str(arch_dir["gemma2"]))
    assert target.head.post_name.startswith("soft-capped")
    bare = anatomy.OutputHead(target.model.get_output_embeddings(), lambda x: x, "none", "gemma2-tiny")
    with pytest.raises(ModelLoadError, match="differ from its own forward"):
        anatomy._probe(target.model, bare)


def test_layer_skip_on_an_architecture_without_decoder_layers_says_so() -> None:
    from specprobe.core.errors import ModelLoadError
    from specprobe.models.anatomy import decoder_layers

    class Odd(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = type("C", (), {"num_hidden_layers": 2})()
            self.model = torch.nn.Module()

    with pytest.raises(ModelLoadError, match="cannot find the decoder layers"):
        decoder_layers(Odd())
