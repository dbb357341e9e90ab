"""Checks that a model holding its quantized weights in memory (QuantLinear) is the same
model as the dequantize-at-load reference: the same weights and the same logits."""

from __future__ import annotations

from typing import Any

import torch

from specprobe.precision.qlinear import QuantLinear, quant_linears

STORED = (torch.float8_e4m3fn, torch.int8, torch.uint8, torch.int32)


def same_as_reference(held: Any, ref: Any, stored: tuple[torch.dtype, ...] = STORED) -> int:
    """Every decoder linear of `held` is a QuantLinear whose dequantized weight equals
    `ref`'s weight bit for bit and whose weight is kept in one of `stored`'s dtypes (no
    float copy of the layer), every other tensor equals `ref`'s, and both models give
    the same logits. -> the number of QuantLinear layers."""
    from specprobe.precision.qlinear import decoder_linears

    ref_linears = dict(decoder_linears(ref))
    layers = 0
    for name, mod in _decoder_modules(held):
        assert isinstance(mod, QuantLinear), name
        want = ref_linears[name].weight
        got = mod.weight_float()
        assert got.dtype == want.dtype and torch.equal(got, want), name
        buffers = dict(mod.named_buffers())
        biggest = max(buffers, key=lambda n: buffers[n].numel())
        assert buffers[biggest].dtype in stored, (name, biggest, buffers[biggest].dtype)
        floats = sum(b.numel() * b.element_size() for b in buffers.values() if b.dtype.is_floating_point and b.dtype not in stored)
        assert floats * 4 <= want.numel() * want.element_size(), (name, floats)  # scales, not a float copy
        layers += 1
    assert layers == len(ref_linears) == len(list(quant_linears(held)))
    held_state = {k: v for k, v in held.state_dict().items() if not any(k.startswith(f"model.{n}.") for n in ref_linears)}
    for k, v in held_state.items():
        assert torch.equal(v, ref.state_dict()[k]), k
    x = torch.tensor([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6]])
    with torch.no_grad():
        if any(m.act for _, m in quant_linears(held)):  # W8A8: the activations are quantized too, so the logits move
            assert not torch.equal(held(x).logits, ref(x).logits)
        else:
            assert torch.equal(held(x).logits, ref(x).logits)
    return layers


def _decoder_modules(model: Any) -> list[tuple[str, Any]]:
    from specprobe.models.anatomy import decoder_layers

    layers, _ = decoder_layers(model)
    out = []
    for i, layer in enumerate(layers):
        for name, mod in layer.named_modules():
            if isinstance(mod, (torch.nn.Linear, QuantLinear)):
                out.append((f"layers.{i}.{name}", mod))
    return out
