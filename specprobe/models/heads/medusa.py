"""Medusa heads in the two layouts people have on disk.

FasterDecoding (`medusa/model/medusa_model*.py`): config.json with `medusa_num_heads`,
`medusa_num_layers`; tensors in `medusa_lm_head.safetensors` named `{h}.{l}.linear.*`
for head h's ResBlocks (x + SiLU(linear(x))) and, in version 1, `{h}.{L}.weight` — the
head's own LM head. Its current training script writes `"version": "2"` heads of
ResBlocks only that reuse the target's LM head. `[ResBlock] * L` repeats ONE module, so
a checkpoint may hold only `{h}.0.*` for L > 1: the same block applied L times.

vLLM (`model_type: medusa`): `blocks.{h}.layers.{l}.weight` (+ bias with
`medusa_fc_bias`), `lm_heads.{h}.weight` (or one shared head with `original_lm_head`),
optional `token_map` (target id of each draft id) with `truncated_vocab_size`.

Head h reads the target's final (normed) hidden state at position t and predicts token
t+2+h: the drafter's depth h+1. Heads are independent, not chained.
"""

from __future__ import annotations

import re
from typing import Any

from specprobe.core.errors import ModelLoadError
from specprobe.models.heads.chain import HeadDrafter, slots_to_positions
from specprobe.models.heads.files import MEDUSA_FILE, HeadFiles
from specprobe.models.heads.layout import HeadLayout

_FD_RE = re.compile(r"^(?P<pre>(?:medusa_head\.)?)(?P<h>\d+)\.(?P<l>\d+)\.(?P<rest>.+)$")
_VLLM_RE = re.compile(r"^(?P<pre>(?:medusa_heads\.)?)blocks\.(?P<h>\d+)\.layers\.(?P<l>\d+)\.(?P<rest>weight|bias)$")


def describe_medusa(files: HeadFiles) -> HeadLayout | None:
    cfg = files.config
    if str(cfg.get("model_type")) == "medusa" or any(_VLLM_RE.match(n) for n in files.tensors):
        return _describe_vllm(files)
    if "medusa_num_heads" in cfg or (files.folder / MEDUSA_FILE).is_file():
        return _describe_fd(files)
    return None


def _describe_fd(files: HeadFiles) -> HeadLayout:
    cfg = files.config
    blocks: dict[int, set[int]] = {}
    heads_own: dict[int, str] = {}
    pre = ""
    for n, info in files.tensors.items():
        m = _FD_RE.match(n)
        if not m:
            continue
        pre = m["pre"]
        h, layer = int(m["h"]), int(m["l"])
        if m["rest"].startswith("linear."):
            blocks.setdefault(h, set()).add(layer)
        elif m["rest"] == "weight" and len(info.shape) == 2:
            heads_own[h] = n
    if not blocks:
        raise ModelLoadError(f"{files.folder}: no Medusa ResBlock tensors ({{h}}.{{l}}.linear.weight) found", f"pass the folder holding {MEDUSA_FILE} and its config.json")
    num_heads = int(cfg.get("medusa_num_heads") or len(blocks))
    num_layers = int(cfg.get("medusa_num_layers") or max(len(v) for v in blocks.values()))
    first = files.shape(f"{pre}0.0.linear.weight") or next(files.shape(n) for n in files.tensors if _FD_RE.match(n) and n.endswith("linear.weight")) or (0,)
    hidden = int(first[0])
    own = sorted(heads_own)
    draft_vocab = int(files.shape(heads_own[own[0]])[0]) if own else 0  # type: ignore[index]
    version = str(cfg.get("version") or ("1" if own else "2"))
    details = {
        **_details("fasterdecoding", pre, num_heads, num_layers, blocks),
        "own_lm_head": {h: heads_own[h] for h in own},
        "version": version,
        "base_model": cfg.get("base_model_name_or_path"),
    }
    label = f"Medusa (FasterDecoding v{version})"
    return HeadLayout("medusa", label, files, hidden, draft_vocab, draft_vocab, num_heads, details)


def _details(fmt: str, pre: str, num_heads: int, num_layers: int, blocks: dict[int, set[int]]) -> dict[str, Any]:
    """What both Medusa layouts' details begin with."""
    return {"format": fmt, "prefix": pre, "num_heads": num_heads, "num_layers": num_layers, "blocks_found": {h: sorted(v) for h, v in blocks.items()}}


def _describe_vllm(files: HeadFiles) -> HeadLayout:
    cfg = files.config
    blocks: dict[int, set[int]] = {}
    pre = ""
    for n in files.tensors:
        m = _VLLM_RE.match(n)
        if m:
            pre = m["pre"]
            blocks.setdefault(int(m["h"]), set()).add(int(m["l"]))
    num_heads = int(cfg.get("num_heads") or cfg.get("medusa_num_heads") or len(blocks))
    num_layers = int(cfg.get("num_hidden_layers") or cfg.get("medusa_num_layers") or max((len(v) for v in blocks.values()), default=1))
    hidden = int(cfg.get("hidden_size") or (files.shape(f"{pre}blocks.0.layers.0.weight") or (0,))[0])
    vocab = int(cfg.get("vocab_size") or 0)
    truncated = int(cfg.get("truncated_vocab_size") or vocab)
    shared = bool(cfg.get("original_lm_head", False))
    heads = {h: f"{pre}lm_heads.{h}.weight" for h in range(num_heads) if files.has(f"{pre}lm_heads.{h}.weight")}
    if shared and f"{pre}lm_heads.0.weight" in files.tensors:
        heads = {h: f"{pre}lm_heads.0.weight" for h in range(num_heads)}
    details = {
        **_details("vllm", pre, num_heads, num_layers, blocks),
        "own_lm_head": heads,
        "fc_bias": bool(cfg.get("medusa_fc_bias", False)),
        "token_map": f"{pre}token_map" if files.has(f"{pre}token_map") else None,
        "truncated_vocab_size": truncated,
    }
    return HeadLayout("medusa", "Medusa (vLLM)", files, hidden, vocab, truncated, num_heads, details)


def block_names(layout: HeadLayout, h: int, layer: int) -> tuple[str, str | None]:
    """(weight, bias or None) tensor names of head h's layer-th block, as stored."""
    d = layout.details
    if d["format"] == "vllm":
        w = f"{d['prefix']}blocks.{h}.layers.{layer}.weight"
        b = f"{d['prefix']}blocks.{h}.layers.{layer}.bias"
    else:
        # `[ResBlock] * L` shares one module: only block 0 may be stored
        found = d["blocks_found"].get(h, [])
        li = layer if layer in found else 0
        w, b = f"{d['prefix']}{h}.{li}.linear.weight", f"{d['prefix']}{h}.{li}.linear.bias"
    return w, (b if layout.files.has(b) else None)


class MedusaDrafter(HeadDrafter):
    """Independent heads: depth d = head d−1 on the target's final hidden state."""

    def _build(self) -> None:
        import torch
        from torch import nn

        target, layout = self.target, self.layout
        d = layout.details
        n, L = d["num_heads"], d["num_layers"]
        names: list[str] = []
        plan: list[list[tuple[str, str | None]]] = []
        for h in range(n):
            row = [block_names(layout, h, layer) for layer in range(L)]
            for w, b in row:
                if not layout.files.has(w):
                    raise ModelLoadError(f"{layout.path}: Medusa head {h} has no tensor {w}", "the checkpoint is incomplete or its config declares more heads than it holds")
                names += [w] + ([b] if b else [])
            plan.append(row)
        names += sorted(set(d["own_lm_head"].values()))
        if d.get("token_map"):
            names.append(d["token_map"])
        t = layout.files.load(sorted(set(names)), device=target.device, dtype=target.dtype)
        self.blocks = nn.ModuleList()
        for row in plan:
            seq = nn.ModuleList()
            for w, b in row:
                lin = nn.Linear(t[w].shape[1], t[w].shape[0], bias=b is not None)
                lin.weight.data = t[w]
                if b is not None:
                    lin.bias.data = t[b]
                seq.append(lin)
            self.blocks.append(seq)
        hidden = int(target.config.hidden_size)
        if layout.hidden_size != hidden:
            raise ModelLoadError(f"{layout.path}: Medusa blocks are {layout.hidden_size} wide, the target's hidden size is {hidden}", "use heads trained for this target")
        self.heads: list[Any] = []
        for h in range(n):
            name = d["own_lm_head"].get(h)
            if name is None:
                self.heads.append(None)  # version 2: the target's own LM head
                continue
            lin = nn.Linear(t[name].shape[1], t[name].shape[0], bias=False)
            lin.weight.data = t[name]
            self.heads.append(lin.eval())
        self.blocks.to(device=target.device, dtype=target.dtype).eval()
        if d.get("token_map"):
            self.ids = t[d["token_map"]].to(torch.long).cpu()
        self._count(self.blocks, *[h for h in self.heads if h is not None])

    def _block(self, h: int, x: Any) -> Any:
        import torch

        for lin in self.blocks[h]:  # type: ignore[attr-defined]  # a ModuleList of Linear
            x = x + torch.nn.functional.silu(lin(x))
        return x

    def features(self, tp: Any) -> dict[int, Any]:
        x = tp.last_hidden
        return {h + 1: slots_to_positions(self._block(h, x)) for h in range(len(self.blocks))}

    def head_logits(self, features: Any, depth: int) -> Any:
        lm = self.heads[depth - 1]
        return self.target.head(features) if lm is None else lm(features.to(lm.weight.dtype))
