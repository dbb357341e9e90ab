"""Where things are inside any causal LM that `AutoModelForCausalLM` loads: the decoder
layers, the final norm, the LM head, and what the model's own forward does to the LM
head's output (Gemma-2/3 soft-capping, Cohere's logit scale, Granite's logit divisor, …).

Scoring needs logits at a few hundred positions out of a batch, chunk by chunk; asking
the forward for all [B, S, V] logits costs memory for nothing, and recomputing them from
`lm_head(hidden)` skips whatever the architecture does after the head. So the head is
wrapped once per model in an `OutputHead` that applies the architecture's own post-head
transform, and that wrapper is *proved* against the model's own forward: at load (on a
short probe sequence) and on every scoring batch (the last position, which the forward
returns anyway). A model whose forward cannot be reproduced is refused with a one-line
error instead of being scored on the wrong distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from specprobe.core.errors import ModelLoadError

# Attribute names of the decoder-layer list and the final norm across architectures
# (Llama/Qwen/Mistral/Gemma/Phi/OLMo/Granite: layers + norm; GPT-2/Falcon: h + ln_f;
# GPT-NeoX: layers + final_layer_norm; Phi-1/2: layers + final_layernorm).
_LAYER_NAMES = ("layers", "h", "blocks", "block")
_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f", "final_norm")
# Max |difference| in logits between our head and the model's own forward (fp32); bf16 /
# fp16 models get a looser bound scaled by the logits' magnitude.
_ATOL_FP32 = 1e-4


def base_model(model: Any) -> Any:
    """The decoder under the LM head (`model.model`, `model.transformer`, `model.gpt_neox`, …)."""
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        for name in ("model", "transformer", "gpt_neox", "decoder"):
            base = getattr(model, name, None)
            if base is not None:
                return base
        raise ModelLoadError(f"cannot find the decoder inside {type(model).__name__}", "this architecture is not supported; use another drafter")
    return base


def decoder_layers(model: Any) -> tuple[Any, str]:
    """(the ModuleList of decoder layers, its attribute name on the base model)."""
    import torch

    base = base_model(model)
    n = getattr(model.config, "num_hidden_layers", None)
    for name in _LAYER_NAMES:
        mod = getattr(base, name, None)
        if isinstance(mod, torch.nn.ModuleList) and (n is None or len(mod) == n):
            return mod, name
    # last resort: the one ModuleList whose length is the layer count
    found = [(k, m) for k, m in base.named_children() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    if len(found) == 1:
        return found[0][1], found[0][0]
    raise ModelLoadError(
        f"cannot find the decoder layers of {type(model).__name__} (looked for {', '.join(_LAYER_NAMES)} on {type(base).__name__})",
        "layer-skip self-drafts need them; use an independent drafter for this architecture",
    )


def final_norm(model: Any) -> Any:
    base = base_model(model)
    for name in _NORM_NAMES:
        mod = getattr(base, name, None)
        if mod is not None:
            return mod
    raise ModelLoadError(
        f"cannot find the final norm of {type(model).__name__} (looked for {', '.join(_NORM_NAMES)} on {type(base).__name__})",
        "layer-skip self-drafts need it; use an independent drafter for this architecture",
    )


# ----------------------------------------------------------------------------- the output head
def _post_transform(config: Any) -> tuple[str, Callable[[Any], Any]]:
    """What the architecture's forward does after `lm_head`, read from its config."""
    import torch

    cap = getattr(config, "final_logit_softcapping", None)
    if cap:  # Gemma-2 / Gemma-3: cap · tanh(logits / cap)
        c = float(cap)
        return f"soft-capped at {c:g}", lambda x: torch.tanh(x / c) * c
    scale = getattr(config, "logit_scale", None)
    if scale is not None and getattr(config, "model_type", "").startswith("cohere"):
        s = float(scale)
        return f"scaled by {s:g}", lambda x: x * s
    div = getattr(config, "logits_scaling", None)
    if div is not None and float(div) != 1.0:  # Granite: logits / logits_scaling
        d = float(div)
        return f"divided by {d:g}", lambda x: x / d
    return "none", lambda x: x


@dataclass
class OutputHead:
    """hidden [N, H] (the input of the model's LM head) -> the logits its forward returns [N, V]."""

    lm_head: Any
    post: Callable[[Any], Any]
    post_name: str
    model_name: str

    def __call__(self, hidden: Any) -> Any:
        w = getattr(self.lm_head, "weight", None)
        if w is not None and hidden.dtype != w.dtype:
            hidden = hidden.to(w.dtype)
        return self.post(self.lm_head(hidden))

    def check(self, ours: Any, theirs: Any, where: str) -> None:
        """Refuse to score when our logits are not the forward's own."""
        import torch

        half = theirs.dtype != torch.float32
        ours, theirs = ours.float(), theirs.float()
        # NaN/inf where the forward has them too (an overflow, a damaged model) is the
        # forward's own output: scoring names those positions (rule SP107). Elsewhere the
        # values must agree.
        same = torch.equal(ours.isnan(), theirs.isnan()) and torch.equal(ours.isposinf(), theirs.isposinf()) and torch.equal(ours.isneginf(), theirs.isneginf())
        fin = theirs.isfinite()
        ours, theirs = ours[fin], theirs[fin]
        scale = float(theirs.abs().amax()) if theirs.numel() else 0.0
        # the same matmul on the same weights: fp32 agrees to round-off; bf16/fp16 to a few ulps
        tol = (2e-2 if half else 1e-5) * max(1.0, scale) + _ATOL_FP32
        err = float((ours - theirs).abs().amax()) if ours.numel() else 0.0
        if not same:
            err = math.inf
        if not math.isfinite(err) or err > tol:
            raise ModelLoadError(
                f"{self.model_name}: logits from its LM head (post-head transform: {self.post_name}) differ from its own forward by {err:.3g} ({where})",
                "this architecture does something after the LM head that specprobe does not reproduce; please report it with the model's config.json",
            )


def output_head(model: Any, name: str | None = None, verify: bool = True) -> OutputHead:
    """The model's LM head plus its post-head transform, verified on a probe sequence."""
    lm = model.get_output_embeddings()
    if lm is None:
        raise ModelLoadError(f"{type(model).__name__} has no LM head", "pass a causal language model (…ForCausalLM)")
    post_name, post = _post_transform(model.config)
    head = OutputHead(lm, post, post_name, name or type(model).__name__)
    if verify:
        _probe(model, head)
    return head


@contextmanager
def capture_last_hidden(model: Any) -> Iterator[dict[str, Any]]:
    """The decoder's last_hidden_state ([B, S, H], the LM head's input before any
    position slicing) from a forward hook, so the model's own forward can run with
    `logits_to_keep=1` and the head is applied chunk by chunk afterwards."""
    box: dict[str, Any] = {}

    def hook(_m: Any, _i: Any, out: Any) -> None:
        h = getattr(out, "last_hidden_state", None)
        box["h"] = h if h is not None else (out[0] if isinstance(out, tuple) else out)

    handle = base_model(model).register_forward_hook(hook)
    try:
        yield box
    finally:
        handle.remove()


def supports_logits_to_keep(model: Any) -> bool:
    import inspect

    return "logits_to_keep" in inspect.signature(type(model).forward).parameters


def output_cache(out: Any) -> Any:
    """The KV cache returned by a forward call, whichever name this version uses."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def forward_last_hidden(model: Any, input_ids: Any, attention_mask: Any, head: OutputHead | None = None, cache_out: list[Any] | None = None, **kw: Any) -> Any:
    """Run the model's own forward; -> the decoder's last hidden state [B, S, H].

    Only the last position's logits are computed (when the model supports it); with a head
    given, they are compared with head(hidden) for the last real token of every row that
    ends at the last column, which proves the head against the forward on every batch.
    With `cache_out` (a list), the forward keeps its KV cache and appends it there."""
    import torch

    extra = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
    with torch.inference_mode(), capture_last_hidden(model) as box:
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=cache_out is not None, **extra, **kw)
        if cache_out is not None:
            cache_out.append(output_cache(out))
        h = box["h"]
        if head is not None:
            rows = attention_mask[:, -1].bool() if attention_mask is not None else torch.ones(h.shape[0], dtype=torch.bool, device=h.device)
            if bool(rows.any()):
                head.check(head(h[rows, -1]), out.logits[rows, -1], "on a scoring batch")
    return h


def _probe(model: Any, head: OutputHead) -> None:
    import torch

    vocab = int(head.lm_head.weight.shape[0]) if getattr(head.lm_head, "weight", None) is not None else 8
    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, max(1, min(vocab, 1000)), (1, 8), generator=g).to(dev)
    with torch.inference_mode(), capture_last_hidden(model) as box:
        out = model(input_ids=ids, use_cache=False)
        head.check(head(box["h"][0]), out.logits[0], "on a probe sequence at load")


# ----------------------------------------------------------------------------- layer views
def layer_view(model: Any, n_layers: int) -> Any:
    """A causal LM of the same class whose first `n_layers` decoder layers, embeddings,
    final norm and head ARE the model's own modules (nothing copied): a layer-skip
    self-draft that generates with its own KV cache."""
    import copy

    import torch

    layers, lname = decoder_layers(model)
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types[:n_layers])
    with torch.device("meta"):
        shell = type(model)(cfg)
    base, sbase = base_model(model), base_model(shell)
    for name, child in base.named_children():
        setattr(sbase, name, torch.nn.ModuleList(list(layers[:n_layers])) if name == lname else child)
    for name, child in model.named_children():
        if child is not base:
            setattr(shell, name, child)
    shell.generation_config = copy.deepcopy(model.generation_config)
    left = [n for n, p in list(shell.named_parameters()) + list(shell.named_buffers()) if p.device.type == "meta"]
    if left:
        raise ModelLoadError(f"layer-skip view of {type(model).__name__} left {left[0]} unshared", "use an independent drafter for this architecture")
    return shell.eval()


@contextmanager
def capture_layers(model: Any, layers: tuple[int, ...]) -> Iterator[dict[int, Any]]:
    """Raw outputs of decoder layers 1..L (1-based, as hidden_states[N]) via forward hooks,
    so only the layers a drafter needs are kept — not all L+1 hidden states."""
    from specprobe.models.anatomy import decoder_layers

    captured: dict[int, Any] = {}
    handles = []
    blocks = decoder_layers(model)[0] if layers else []
    for n in layers:
        def hook(_mod: Any, _inp: Any, output: Any, n: int = n) -> None:
            captured[n] = output[0] if isinstance(output, tuple) else output
        handles.append(blocks[n - 1].register_forward_hook(hook))
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()
