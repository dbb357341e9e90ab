"""Tiny real checkpoints (LlamaConfig, 2 layers, a few hundred tokens) written to disk
with a real fast tokenizer, plus broken twins: a vocab-shuffled copy, a random drafter,
a drafter whose generation_config samples at another temperature."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

WORDS = [f"w{i}" for i in range(280)]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = "{% for m in messages %}<s> {{ m['content'] }} </s> {% endfor %}{% if add_generation_prompt %}<s> {% endif %}"


def _tokenizer(vocab: dict[str, int]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def base_vocab() -> dict[str, int]:
    return {t: i for i, t in enumerate(SPECIALS + WORDS)}


def _model(seed: int, vocab_size: int, scale: float = 8.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=3,
    )
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        # a peaked, model-specific distribution (random init is near uniform)
        m.lm_head.weight.mul_(scale / m.lm_head.weight.std())
    return m


def save(model, tok, path: Path, gen: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    if gen is not None:
        (path / "generation_config.json").write_text(json.dumps(gen))
    return path


def build_family(root: Path) -> dict[str, Path]:
    vocab = base_vocab()
    n = len(vocab)
    tok = _tokenizer(vocab)
    target = _model(0, n)
    out = {"target": save(target, tok, root / "target")}
    out["twin"] = save(target, tok, root / "twin")
    out["random"] = save(_model(99, n), tok, root / "random")
    out["hot"] = save(target, tok, root / "hot", gen={"do_sample": True, "temperature": 1.5})
    # vocab-shuffled: same model in another id space (specials kept)
    g = torch.Generator().manual_seed(7)
    perm = torch.arange(n)
    perm[4:] = 4 + torch.randperm(n - 4, generator=g)
    shuffled_vocab = {t: int(perm[i]) for t, i in vocab.items()}
    sh = _model(0, n)
    with torch.no_grad():
        sh.model.embed_tokens.weight[perm] = target.model.embed_tokens.weight.clone()
        sh.lm_head.weight[perm] = target.lm_head.weight.clone()
    out["shuffled"] = save(sh, _tokenizer(shuffled_vocab), root / "shuffled")
    return out


def prompts_file(path: Path, n: int = 6, words: int = 8) -> Path:
    lines = []
    for i in range(n):
        text = " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words))
        lines.append(json.dumps({"id": f"p{i}", "prompt": text, "domain": ["code", "math", "chat"][i % 3]}))
    path.write_text("\n".join(lines) + "\n")
    return path


# ----------------------------------------------------------------------------- in memory
def tiny_llama(hidden: int = 32, kv_heads: int = 2) -> Any:
    """A random two-layer Llama (vocabulary 50, 4 attention heads) in eval mode, seed 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=50, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def spy_attention(name: str, record: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]) -> str:
    """An attention implementation registered as `name` that hands each call's q, k, v
    to `record` and runs sdpa; its name, for `config._attn_implementation`."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    def spy(mod, q, k, v, *a, **kw):
        record(q, k, v)
        return sdpa_attention_forward(mod, q, k, v, *a, **kw)

    AttentionInterface.register(name, spy)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return name
