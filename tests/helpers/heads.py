"""Tiny head checkpoints in the exact on-disk layouts people deploy (config keys, tensor
names, shapes), over the tiny Llama target of tests/helpers/tiny.py, plus oracle heads.

Oracles run over a *bigram* twin of the tiny target (decoder layers zeroed, embedding
rows of unit RMS, final norm 1), whose next-token distribution depends on the current
token only: p_t = softmax(W · E[x_t]). A head that reproduces W · E[token fed at that
step] therefore matches the target at every depth, exactly (up to the norms' eps):
- EAGLE-1 / MTP: the embedding enters the residual stream directly (fc / eh_proj pick
  it), the block's o_proj and down_proj are zero;
- EAGLE-3: the embedding reaches the residual only through attention, so q and k are
  constant biases whose rotary scores peak at distance 0 (each slot attends to itself),
  v = [ê; −ĥ] cancels the incoming hidden state, o_proj = I;
- Medusa: heads cannot see the next token, so the oracle target is a *unigram* one
  (all embedding rows equal), where every depth's distribution is the same.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tests.helpers.tiny import _model, _tokenizer, base_vocab, save

H, HEADS, KV, HD, INTER = 64, 4, 4, 16, 96  # head sizes (kv·hd = H: the EAGLE-3 oracle needs v to be H wide)


# ----------------------------------------------------------------------------- targets
def target_tensors(target: Path) -> dict[str, torch.Tensor]:
    return load_file(str(target / "model.safetensors"))


def bigram_target(dest: Path, unigram: bool = False, seed: int = 5) -> Path:
    """The tiny Llama with every layer's o_proj/down_proj zeroed (hidden = embedding),
    unit-RMS embedding rows and final norm 1: p_t depends on x_t only (or on nothing)."""
    vocab = base_vocab()
    m = _model(seed, len(vocab))
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        e = m.model.embed_tokens.weight
        e[3] = torch.randn(e.shape[1], generator=_g(seed))  # the pad row is zero-initialised
        if unigram:
            e.copy_(e[4:5].expand_as(e))
        e.div_(e.pow(2).mean(-1, keepdim=True).sqrt())
        m.model.norm.weight.fill_(1.0)
    return save(m, _tokenizer(vocab), dest)


def add_tensors(folder: Path, extra: dict[str, torch.Tensor], config: dict[str, Any] | None = None) -> Path:
    """Write extra tensors (MTP layers) into a saved target's model.safetensors."""
    sd = target_tensors(folder)
    sd.update({k: v.contiguous() for k, v in extra.items()})
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if config:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(config)
        (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def copy_target(src: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(src, dest)
    return dest


# ----------------------------------------------------------------------------- pieces
def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rand(g: torch.Generator, *shape: int, scale: float = 0.1) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def layer_config(vocab: int, *, attention_bias: bool = False, rope_theta: float = 10000.0, hidden: int = H) -> dict[str, Any]:
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "intermediate_size": INTER,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD, "num_hidden_layers": 1, "vocab_size": vocab,
        "rms_norm_eps": 1e-6, "rope_theta": rope_theta, "max_position_embeddings": 512, "attention_bias": attention_bias,
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
    }


def llama_layer(g: torch.Generator, pre: str, in_dim: int, *, bias: bool = False, norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm"), hidden: int = H,
                heads: int = HEADS, kv: int = KV, inter: int = INTER) -> dict[str, torch.Tensor]:
    t = {
        pre + "self_attn.q_proj.weight": _rand(g, heads * HD, in_dim), pre + "self_attn.k_proj.weight": _rand(g, kv * HD, in_dim),
        pre + "self_attn.v_proj.weight": _rand(g, kv * HD, in_dim), pre + "self_attn.o_proj.weight": _rand(g, hidden, heads * HD),
        pre + "mlp.gate_proj.weight": _rand(g, inter, hidden), pre + "mlp.up_proj.weight": _rand(g, inter, hidden), pre + "mlp.down_proj.weight": _rand(g, hidden, inter),
    }
    if bias:
        for p in ("q", "k", "v"):
            t[f"{pre}self_attn.{p}_proj.bias"] = torch.zeros(t[f"{pre}self_attn.{p}_proj.weight"].shape[0])
        t[pre + "self_attn.o_proj.bias"] = torch.zeros(hidden)
    for n in norms:
        t[pre + n + ".weight"] = 1.0 + _rand(g, hidden, scale=0.05)
    return t


def draft_vocab(v: int, vd: int, seed: int = 3) -> torch.Tensor:
    """A sorted subset of vd target ids (specials always in)."""
    perm = torch.randperm(v - 4, generator=_g(seed))[: vd - 4] + 4
    return torch.cat([torch.arange(4), perm]).sort().values


def d2t_t2d(ids: torch.Tensor, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    d2t = ids - torch.arange(ids.shape[0])
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    return d2t.to(torch.int64), t2d


def _write(dest: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], file: str = "model.safetensors") -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dest / file), metadata={"format": "pt"})
    return dest


# ----------------------------------------------------------------------------- EAGLE-3
def _self_attending_qk(scale_gap: float = 60.0, slots: int = 200, rope_theta: float = 100.0) -> torch.Tensor:
    """A constant query/key (per head) whose rotary scores peak at distance 0 by at least
    `scale_gap` nats over distances 1..slots."""
    theta = rope_theta ** (-torch.arange(0, HD, 2).float() / HD)  # [HD/2]
    d = torch.arange(1, slots + 1).float()[:, None]
    gap = (1 - torch.cos(d * theta)).sum(-1).min()  # per unit |u_pair|²
    c = scale_gap * math.sqrt(HD) / float(gap)  # |u_pair|² so that score gap ≥ scale_gap
    u = torch.full((HD,), math.sqrt(c / 2))  # pair (a, b): a² + b² = c
    return u.repeat(HEADS)


def eagle3_tensors(target: Path, *, vd: int | None = None, oracle: bool = False, hidden: int = H, seed: int = 11, n_aux: int = 3, prefix: str = "layers.0.", embed: bool = False) -> dict[str, torch.Tensor]:
    tt = target_tensors(target)
    v, ht = tt["lm_head.weight"].shape
    g = _g(seed)
    pre = prefix
    t = {"fc.weight": _rand(g, hidden, n_aux * ht), "norm.weight": 1.0 + _rand(g, hidden, scale=0.05)}
    t.update(llama_layer(g, pre, 2 * hidden, bias=oracle, norms=("input_layernorm", "hidden_norm", "post_attention_layernorm"), hidden=hidden))
    ids = draft_vocab(v, vd) if vd and vd < v else torch.arange(v)
    t["lm_head.weight"] = _rand(g, ids.shape[0], hidden, scale=1.0)
    t["d2t"], t["t2d"] = d2t_t2d(ids, v)
    if embed:
        t["embed_tokens.weight"] = _rand(g, v, hidden, scale=1.0)
    if oracle:
        assert hidden == ht
        eye = torch.eye(hidden)
        t["fc.weight"].zero_()
        for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            t[f"{pre}{n}.weight"] = torch.ones(hidden)
        t["norm.weight"] = torch.ones(hidden)
        qk = _self_attending_qk()
        for p in ("q", "k"):
            t[f"{pre}self_attn.{p}_proj.weight"].zero_()
            t[f"{pre}self_attn.{p}_proj.bias"] = qk.clone()
        t[pre + "self_attn.v_proj.weight"] = torch.cat([eye, -eye], dim=1)  # v = ê − ĥ
        t[pre + "self_attn.o_proj.weight"] = eye.clone()
        t[pre + "mlp.down_proj.weight"].zero_()
        t["lm_head.weight"] = tt["lm_head.weight"][ids].clone()
    return t


def eagle3_speculators(dest: Path, target: Path, *, aux: tuple[int, ...] | None = (0, 1, 2), norm_before_residual: bool | None = False, verifier: str = "target", layer_type: str = "llama", oracle: bool = False, **kw: Any) -> Path:
    """The speculators layout vLLM loads (tensors `layers.0.*`)."""
    t = eagle3_tensors(target, oracle=oracle, **kw)
    v = int(target_tensors(target)["lm_head.weight"].shape[0])
    lc = layer_config(v, attention_bias=oracle, rope_theta=100.0 if oracle else 10000.0, hidden=int(t["norm.weight"].shape[0]))
    lc["model_type"] = layer_type
    cfg: dict[str, Any] = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.2.0",
        "draft_vocab_size": int(t["lm_head.weight"].shape[0]), "target_hidden_size": int(target_tensors(target)["lm_head.weight"].shape[1]),
        "transformer_layer_config": lc,
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy", "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                               "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}},
    }
    if aux is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = list(aux)
    if norm_before_residual is not None:
        cfg["norm_before_residual"] = norm_before_residual
    return _write(dest, cfg, t)


def eagle3_export(dest: Path, target: Path, *, aux: tuple[int, ...] | None = (0, 0, 1), oracle: bool = False, **kw: Any) -> Path:
    """The EAGLE / SpecForge export (`LlamaForCausalLMEagle3`, tensors `midlayer.*`); aux
    ids in SGLang's convention (hidden_states[id + 1])."""
    t = eagle3_tensors(target, oracle=oracle, prefix="midlayer.", **kw)
    v = int(target_tensors(target)["lm_head.weight"].shape[0])
    cfg = layer_config(v, attention_bias=oracle, rope_theta=100.0 if oracle else 10000.0, hidden=int(t["norm.weight"].shape[0]))
    cfg.update({"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": int(t["lm_head.weight"].shape[0])})
    if aux is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux), "use_aux_hidden_state": True}
    return _write(dest, cfg, t)


# ----------------------------------------------------------------------------- EAGLE-1
def eagle1(dest: Path, target: Path, *, oracle: bool = False, seed: int = 13) -> Path:
    tt = target_tensors(target)
    v, ht = tt["lm_head.weight"].shape
    g = _g(seed)
    t = {"fc.weight": _rand(g, H, 2 * ht), "fc.bias": torch.zeros(H)}
    t.update(llama_layer(g, "layers.0.", H, norms=("post_attention_layernorm",)))
    if oracle:
        t["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], dim=1)  # picks the embedding
        t["layers.0.self_attn.o_proj.weight"].zero_()
        t["layers.0.mlp.down_proj.weight"].zero_()
    return _write(dest, layer_config(int(v)), t)


# ----------------------------------------------------------------------------- Medusa
def medusa_fasterdecoding(dest: Path, target: Path, *, heads: int = 3, layers: int = 1, version: int = 2, oracle: bool = False, seed: int = 17, hidden: int | None = None) -> Path:
    """FasterDecoding: config.json (medusa_num_heads/layers) + medusa_lm_head.safetensors."""
    tt = target_tensors(target)
    v, ht = tt["lm_head.weight"].shape
    h = hidden or int(ht)
    g = _g(seed)
    t: dict[str, torch.Tensor] = {}
    for i in range(heads):
        for j in range(layers):
            t[f"{i}.{j}.linear.weight"] = torch.zeros(h, h) if oracle else _rand(g, h, h, scale=0.2)
            t[f"{i}.{j}.linear.bias"] = torch.zeros(h) if oracle else _rand(g, h)
        if version == 1:
            t[f"{i}.{layers}.weight"] = tt["lm_head.weight"].clone() if oracle else _rand(g, int(v), h, scale=1.0)
    cfg = {"medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": "target", "version": str(version), "transformers_version": "4.40.0"}
    return _write(dest, cfg, t, file="medusa_lm_head.safetensors")


def medusa_vllm(dest: Path, target: Path, *, heads: int = 3, layers: int = 2, vd: int | None = None, seed: int = 19) -> Path:
    """vLLM's layout: model_type medusa, blocks.{h}.layers.{l}, lm_heads.{h}, token_map."""
    tt = target_tensors(target)
    v, ht = tt["lm_head.weight"].shape
    g = _g(seed)
    ids = draft_vocab(int(v), vd) if vd else torch.arange(int(v))
    t = {f"blocks.{i}.layers.{j}.weight": _rand(g, int(ht), int(ht), scale=0.2) for i in range(heads) for j in range(layers)}
    t.update({f"lm_heads.{i}.weight": tt["lm_head.weight"][ids].clone() + _rand(g, ids.shape[0], int(ht), scale=0.5) for i in range(heads)})
    cfg = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": int(ht), "vocab_size": int(v), "num_heads": heads, "num_hidden_layers": layers,
           "truncated_vocab_size": int(ids.shape[0]), "medusa_fc_bias": False, "max_paths": 64, "topk": 10}
    if vd:
        t["token_map"] = ids.to(torch.int64)
    return _write(dest, cfg, t)


# ----------------------------------------------------------------------------- MTP
def mtp_tensors(target: Path, style: str, *, layers: int = 1, oracle: bool = False, swap: bool = False, seed: int = 23) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """MTP weights for the target's checkpoint in one of the three layouts, and the config
    keys that declare them. swap=True writes MiMo's projection for the other order."""
    tt = target_tensors(target)
    v, ht = tt["lm_head.weight"].shape
    L = sum(1 for k in tt if k.endswith("self_attn.q_proj.weight"))
    g = _g(seed)
    out: dict[str, torch.Tensor] = {}
    eye, zero = torch.eye(int(ht)), torch.zeros(int(ht), int(ht))
    # the projection that picks the embedding half of its input
    pick_embed = torch.cat([zero, eye], dim=1) if style == "mimo" else torch.cat([eye, zero], dim=1)
    for k in range(layers):
        pre = {"deepseek": f"model.layers.{L + k}.", "qwen3_next": f"mtp.layers.{k}.", "mimo": f"model.mtp_layers.{k}."}[style]
        tc = json.loads((target / "config.json").read_text())  # the block is one of the target's own layers
        blk = llama_layer(g, pre, int(ht), hidden=int(ht), heads=tc["num_attention_heads"], kv=tc["num_key_value_heads"], inter=tc["intermediate_size"])
        if oracle:
            blk[pre + "self_attn.o_proj.weight"].zero_()
            blk[pre + "mlp.down_proj.weight"].zero_()
        out.update(blk)
        proj = pick_embed.clone() if oracle else _rand(g, int(ht), 2 * int(ht))
        if swap:
            proj = torch.cat([proj[:, ht:], proj[:, :ht]], dim=1)
        one = torch.zeros(int(ht)) if style == "qwen3_next" else torch.ones(int(ht))  # Qwen3-Next norms are x·(1 + w)
        if style == "deepseek":
            out.update({pre + "enorm.weight": one, pre + "hnorm.weight": one.clone(), pre + "eh_proj.weight": proj, pre + "shared_head.norm.weight": one.clone(),
                        pre + "shared_head.head.weight": tt["lm_head.weight"].clone(), pre + "embed_tokens.weight": tt["model.embed_tokens.weight"].clone()})
        elif style == "mimo":
            out.update({pre + "token_layernorm.weight": one, pre + "hidden_layernorm.weight": one.clone(), pre + "input_proj.weight": proj, pre + "final_layernorm.weight": one.clone()})
        else:
            out.update({"mtp.pre_fc_norm_embedding.weight": one, "mtp.pre_fc_norm_hidden.weight": one.clone(), "mtp.fc.weight": proj, "mtp.norm.weight": one.clone()})
    key = "mtp_num_hidden_layers" if style == "qwen3_next" else "num_nextn_predict_layers"
    return out, {key: layers}


def target_with_mtp(dest: Path, base: Path, style: str, **kw: Any) -> Path:
    tensors, cfg = mtp_tensors(base, style, **kw)
    return add_tensors(copy_target(base, dest), tensors, cfg)


def every_layout(root: Path, target: Path, *, prefixed: bool = False) -> dict[str, tuple[Path, str]]:
    """name -> (target folder, drafter spec): one random head of every layout under root.
    `prefixed` writes some specs with their layout prefix (`eagle3:`, `eagle:`, `medusa:`),
    as users do; otherwise the layout is detected from the folder."""
    def spec(prefix: str, path: Path) -> str:
        return f"{prefix}:{path}" if prefixed else str(path)

    out = {
        "eagle3-speculators": (target, spec("eagle3", eagle3_speculators(root / "e3s", target, vd=150))),
        "eagle3-export": (target, str(eagle3_export(root / "e3x", target, vd=150, embed=True))),
        "eagle1": (target, spec("eagle", eagle1(root / "e1", target))),
        "medusa-fd-v2": (target, spec("medusa", medusa_fasterdecoding(root / "m2", target))),
        "medusa-fd-v1": (target, str(medusa_fasterdecoding(root / "m1", target, version=1, layers=2))),
        "medusa-vllm": (target, str(medusa_vllm(root / "mv", target, vd=200))),
    }
    for style in ("deepseek", "qwen3_next", "mimo"):
        out[f"mtp-{style}"] = (target_with_mtp(root / f"t-{style}", target, style), "mtp")
    return out


# ----------------------------------------------------------------------------- loaded
def load_pair(target: Path, spec: str) -> tuple[Any, Any]:
    """The target loaded on the CPU in float32 and the drafter `spec` built against it."""
    from specprobe.models.drafters import build_drafter, drafter_info
    from specprobe.models.loader import load_model

    t = load_model(str(target), device="cpu", dtype="float32")
    return t, build_drafter(spec, t, info=drafter_info(spec, t.info))


def head_prompts(n: int = 5, seed: int = 5) -> list[list[int]]:
    """n random prompts of 3–13 ids from the tiny vocabulary's words."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 284, (int(L),), generator=g).tolist() for L in torch.randint(3, 14, (n,), generator=g)]
