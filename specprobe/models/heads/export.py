"""Write heads in the layouts engines load: EAGLE-3 in the speculators layout (what vLLM
reads: config.json with `speculators_model_type`, `transformer_layer_config`,
`speculators_config`; tensors fc.*, layers.0.*, norm.weight, lm_head.weight, d2t, t2d)
and Medusa in FasterDecoding's (config.json + medusa_lm_head.safetensors with
`{h}.{l}.linear.*`, version 2: the target's LM head is reused)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EAGLE3_LAYER_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
    "rope_theta", "rope_scaling", "max_position_embeddings", "hidden_act", "attention_bias", "mlp_bias", "vocab_size",
    "bos_token_id", "eos_token_id", "pad_token_id",
)


def eagle3_layer_config(target_config: Any, **override: Any) -> dict[str, Any]:
    """A one-layer Llama config for an EAGLE-3 head over this target (its sizes by default)."""
    cfg: dict[str, Any] = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "tie_word_embeddings": False}
    for k in EAGLE3_LAYER_KEYS:
        v = getattr(target_config, k, None)
        if v is not None:
            cfg[k] = v
    cfg.setdefault("head_dim", int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    cfg.update(override)
    return cfg


def write_eagle3_speculators(
    dest: Path,
    head: Any,
    layer_config: dict[str, Any],
    draft_ids: Any,
    target_vocab: int,
    *,
    aux_ids: list[int] | None,
    verifier: str,
    verifier_architectures: list[str] | None = None,
    speculative_tokens: int = 3,
) -> Path:
    """An `Eagle3Head` (layers.Eagle3Head) in the speculators layout. draft_ids [Vd]:
    the sorted target id of each draft id (d2t = draft_ids − arange)."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.float32).contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    tensors = {("layers.0." + k[len("layer.") :] if k.startswith("layer.") else k): v for k, v in sd.items()}
    ids = torch.as_tensor(draft_ids, dtype=torch.long)
    tensors["d2t"] = (ids - torch.arange(ids.shape[0])).contiguous()
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config: dict[str, Any] = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.2.0",
        "draft_vocab_size": int(ids.shape[0]),
        "norm_before_residual": bool(head.norm_before_residual),
        "target_hidden_size": int(head.fc.weight.shape[1]) // max(1, len(aux_ids) if aux_ids else 3),
        "transformer_layer_config": layer_config,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures or []},
        },
    }
    if aux_ids:
        config["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dest


def write_medusa_fasterdecoding(dest: Path, blocks: Any, *, num_layers: int, base_model: str) -> Path:
    """Medusa heads as FasterDecoding's training script writes them (version 2): blocks[h]
    is a sequence of Linear(H, H) ResBlock layers; no LM head of their own."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Any] = {}
    for h, seq in enumerate(blocks):
        for layer, lin in enumerate(seq):
            tensors[f"{h}.{layer}.linear.weight"] = lin.weight.detach().to(torch.float32).contiguous()
            tensors[f"{h}.{layer}.linear.bias"] = lin.bias.detach().to(torch.float32).contiguous()
    save_file(tensors, str(dest / "medusa_lm_head.safetensors"), metadata={"format": "pt"})
    config = {"medusa_num_heads": len(blocks), "medusa_num_layers": num_layers, "base_model_name_or_path": base_model, "version": "2"}
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dest
