"""The text every drafter is scored on: prompts loaded and encoded for the target, and the
reference continuations after them — on-policy (sampled from the target with its own
settings, seeded, cached per batch on disk so an interrupted run resumes) or the
dataset's own responses (off-policy)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specprobe.core.errors import InputError
from specprobe.core.interrupts import shielded
from specprobe.core.progress import Progress
from specprobe.models.loader import cache_root
from specprobe.probe.refcache import ReferenceCache
from specprobe.prompts import Prompt, PromptSet, builtin_suite, load_prompts, select
from specprobe.settings.pipeline import DiagnoseConfig


# ----------------------------------------------------------------------------- prompts
def load_prompt_set(cfg: DiagnoseConfig) -> PromptSet:
    ps = builtin_suite() if cfg.prompts == "builtin" else load_prompts(cfg.prompts)
    ps = select(ps, domains=cfg.domains, max_prompts=cfg.max_prompts)
    if cfg.reference == "dataset":
        missing = [p.id for p in ps.prompts if not p.reference]
        if missing:
            raise InputError(
                f"--reference dataset needs a response for every prompt; {len(missing)} of {len(ps.prompts)} {'has' if len(missing) == 1 else 'have'} none (first: {missing[0]})",
                "give 'reference'/'response'/'answer' in the prompts file, or use the default on-policy references",
            )
    return ps


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """A conversation ending with a user turn, through the chat template when the model
    has one (generation prompt added); without one, the turns as plain text."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(x) for x in ids]
    text = "\n\n".join(m["content"] for m in messages)
    return [int(x) for x in tokenizer(text, add_special_tokens=True)["input_ids"]]


def encode_prompt(tokenizer: Any, prompt: Prompt, turn: int = 0, answers: Sequence[str] = ()) -> list[int]:
    """User turn `turn` of a prompt after the earlier turns and the model's own `answers`
    to them (the first turn alone by default)."""
    return encode_messages(tokenizer, prompt.messages(turn, answers))


def encode_prompts(target: Any, prompts: list[Prompt], max_new_tokens: int) -> list[list[int]]:
    """Every prompt encoded; InputError when one plus its continuation would not fit the
    target's context (found before any forward pass)."""
    encoded = [encode_prompt(target.tokenizer, p) for p in prompts]
    ctx = getattr(target.config, "max_position_embeddings", None)
    for p, e in zip(prompts, encoded, strict=True):
        if ctx and len(e) + max_new_tokens > ctx:
            raise InputError(f"prompt {p.id} is {len(e)} tokens; with --max-new-tokens {max_new_tokens} it exceeds the target's context of {ctx}", "shorten the prompt or lower --max-new-tokens")
    return encoded


# ----------------------------------------------------------------------------- on-policy references
class References(list):  # type: ignore[type-arg]
    """Continuations, one per prompt ([] where none was made); `interrupted` when Ctrl-C
    stopped generation part-way: the finished batches are on disk and in here, and so is
    what the batch being generated had reached — `cut` of its continuations stopped
    short of EOS and the token budget (a prefix of what the target would write)."""

    interrupted: bool = False
    cut: int = 0


class _Cut(KeyboardInterrupt):
    """Ctrl-C inside one batch's generation, with what each row had reached."""

    def __init__(self, conts: list[list[int]], finished: list[bool]) -> None:
        super().__init__()
        self.conts = conts
        self.finished = finished


class _Reached:
    """A stopping criterion that never stops: it keeps the latest ids generate() made, so
    a Ctrl-C between two steps (or inside one) still has every token sampled so far."""

    def __init__(self) -> None:
        self.ids: Any = None
        self._never: Any = None

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        self.ids = input_ids
        if self._never is None or self._never.shape[0] != input_ids.shape[0]:
            self._never = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return self._never


def _model_identity(loaded: Any) -> str:
    path = Path(loaded.info.path)
    files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    stamp = [(f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in files]
    served = getattr(loaded, "quant", None)  # weights quantized after loading write other text
    kv = getattr(loaded, "kv_cache_dtype", None)  # so does an fp8 KV cache
    return json.dumps([str(path), stamp] + ([served.scheme] if served is not None else []) + ([f"kv:{kv}"] if kv else []))


def _cache_file(target: Any, encoded: list[list[int]], sampling: Any, cfg: DiagnoseConfig, batching: Any = None) -> Path:
    """One file per (weights, dtype, device, sampling, budget, seed, batching, prompts):
    anything that changes what generation would produce changes the key."""
    key_src = json.dumps([_model_identity(target), str(target.dtype), target.device, sampling.to_dict(), cfg.max_new_tokens, cfg.seed, cfg.batch_size, encoded] + ([batching] if batching is not None else []))
    key = hashlib.sha256(key_src.encode()).hexdigest()[:24]
    return cache_root() / "references" / f"{key}.jsonl"


def generate_references(target: Any, encoded: list[list[int]], sampling: Any, cfg: DiagnoseConfig, progress: Progress, shard: Any = None, groups: Sequence[int] | None = None, turn: int = 0) -> list[list[int]]:
    """On-policy continuations: sampled from the target with its own settings, seeded,
    batched (left padding), cached per batch on disk so an interrupted run resumes (and
    keeps what the batch Ctrl-C cut had reached).
    shard (index, count): only batches b with b % count == index are generated (the
    others stay []), each exactly as an unsharded run would sample it.
    groups: the batch each entry belongs to (entries of one group in order), instead of
    consecutive batches of --batch-size; with `turn`, it keeps a later turn's batches and
    seeds those of its first turn, so a shard samples them as a whole run does."""
    from transformers import GenerationConfig

    tok = target.tokenizer
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    if groups is None:
        batches = [list(range(i, min(i + cfg.batch_size, len(encoded)))) for i in range(0, len(encoded), cfg.batch_size)]
    else:
        batches = [[] for _ in range(max(groups, default=-1) + 1)]
        for i, g in enumerate(groups):
            batches[g].append(i)
    # checked line by line, locked around each batch (specprobe.probe.refcache)
    cache = ReferenceCache(_cache_file(target, encoded, sampling, cfg, None if groups is None else [list(groups), turn]), [len(b) for b in batches], target.vocab_size, cfg.max_new_tokens, progress.note) if cfg.use_cache else None
    if shard is not None:  # another shard's batches: skipped here, seeds and cache keys unchanged
        batches = [b if bi % shard[1] == shard[0] else [] for bi, b in enumerate(batches)]
    out = References([] for _ in encoded)
    gen_cfg = GenerationConfig(
        max_new_tokens=cfg.max_new_tokens,
        do_sample=not sampling.greedy,
        temperature=sampling.temperature if not sampling.greedy else 1.0,
        top_k=sampling.top_k or 0,
        top_p=sampling.top_p,
        min_p=sampling.min_p or None,
        pad_token_id=pad,
        eos_token_id=eos,
        remove_invalid_values=True,  # NaN/inf logits sample something; scoring then names those positions
    )
    todo = sum(len(b) for b in batches)
    with progress.task(f"generating on-policy references ({todo} prompts × ≤{cfg.max_new_tokens} tokens)", todo) as advance:
        try:
            _generate_batches(target, encoded, batches, out, gen_cfg, pad, eos, cache, cfg, advance, turn)
        except KeyboardInterrupt:
            out.interrupted = True  # finished batches and what the cut one reached are kept; score those
    return out


def _generate_batches(target: Any, encoded: list[list[int]], batches: list[list[int]], out: References, gen_cfg: Any, pad: int, eos: int | None, cache: ReferenceCache | None, cfg: DiagnoseConfig, advance: Any, turn: int = 0) -> None:
    """Generate batch by batch (reusing cached batches), appending each to the cache. A
    batch cut short by Ctrl-C keeps what its rows had reached (in `out` and the cache)
    and the interrupt goes on up."""
    for bi, idx in enumerate(batches):
        if not idx:
            continue
        # Holding the cache's lock: a run sharing it either wrote this batch already or
        # waits for it here, so each batch is generated once.
        with cache.locked() if cache is not None else nullcontext():
            done = cache.read() if cache is not None else {}
            try:
                conts = done[bi] if bi in done else _generate_batch(target, encoded, idx, bi, gen_cfg, pad, eos, cfg, turn)
            except _Cut as cut:
                with shielded():  # a second press waits until this is kept
                    _keep_cut(cut, cache.partial(bi) if cache is not None else None, idx, out, cache, bi, advance)
                raise
            if cache is not None and bi not in done:
                cache.append(bi, conts)
        for r, i in enumerate(idx):
            out[i] = conts[r]
        advance(len(idx))


def _keep_cut(cut: _Cut, before: tuple[list[list[int]], list[bool]] | None, idx: list[int], out: References, cache: ReferenceCache | None, bi: int, advance: Any) -> None:
    """What a cut batch had reached, per row the further of this run's and an earlier cut
    run's (the same seeded tokens, so one is a prefix of the other)."""
    conts, finished = list(cut.conts), list(cut.finished)
    if before is not None:
        for r, (c, f) in enumerate(zip(*before, strict=True)):
            if not finished[r] and (f or len(c) > len(conts[r])) and c[: len(conts[r])] == conts[r]:
                conts[r], finished[r] = c, f
    if cache is not None and any(conts) and (before is None or (conts, finished) != (before[0], before[1])):
        cache.append_partial(bi, conts, finished)
    for r, i in enumerate(idx):
        out[i] = conts[r]
    out.cut += sum(1 for c, f in zip(conts, finished, strict=True) if c and not f)
    advance(sum(finished))


def _generate_batch(target: Any, encoded: list[list[int]], idx: list[int], bi: int, gen_cfg: Any, pad: int, eos: int | None, cfg: DiagnoseConfig, turn: int = 0) -> list[list[int]]:
    """One batch sampled from the target (left-padded), seeded by its index and turn."""
    import torch

    width = max(len(encoded[i]) for i in idx)
    ids = torch.full((len(idx), width), pad, dtype=torch.long)  # [B, S] left-padded
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    for r, i in enumerate(idx):
        ids[r, width - len(encoded[i]) :] = torch.tensor(encoded[i])
        mask[r, width - len(encoded[i]) :] = 1
    # seeded per batch, so a resumed run regenerates exactly the batches it lacks
    torch.manual_seed(cfg.seed * 100_003 + bi + turn * 1_000_003)
    from transformers import StoppingCriteriaList

    reached = _Reached()
    try:
        with torch.inference_mode():
            gen = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device), generation_config=gen_cfg, stopping_criteria=StoppingCriteriaList([reached]))
    except KeyboardInterrupt:
        if reached.ids is None:  # not one token yet
            raise _Cut([[] for _ in idx], [False] * len(idx)) from None
        conts = [_trim(reached.ids[r, width:].tolist(), pad, eos) for r in range(len(idx))]
        raise _Cut(conts, [(eos is not None and eos in c) or len(c) >= cfg.max_new_tokens for c in conts]) from None
    return [_trim(gen[r, width:].tolist(), pad, eos) for r in range(len(idx))]


def _trim(c: list[int], pad: int, eos: int | None) -> list[int]:
    """Cut after the first EOS (kept) and drop trailing padding."""
    if eos is not None and eos in c:
        c = c[: c.index(eos) + 1]
    while c and c[-1] == pad and pad != eos:
        c.pop()
    return c


# ----------------------------------------------------------------------------- off-policy references
def dataset_references(tokenizer: Any, prompts: list[Prompt], max_new_tokens: int) -> list[list[int]]:
    """The dataset's responses, tokenised and cut to the token budget."""
    out = []
    for p in prompts:
        ids = tokenizer(p.reference or "", add_special_tokens=False)["input_ids"]
        out.append([int(x) for x in ids[:max_new_tokens]])
    return out


# ----------------------------------------------------------------------------- every turn
@dataclass
class TurnReferences:
    """What gets scored: one item per (prompt, turn) — turn 1 keeps the prompt's id, a
    later turn i is "<id>#i" — with its encoded conversation and its continuation."""

    items: list[Prompt]
    encoded: list[list[int]]
    conts: list[list[int]]
    interrupted: bool = False
    skipped: int = 0  # later turns left out: they would not fit the target's context
    cut: int = 0  # continuations Ctrl-C stopped short (scored as far as they reached)


def references_by_turn(target: Any, prompts: list[Prompt], cfg: DiagnoseConfig, sampling: Any, progress: Progress) -> TurnReferences:
    """References for every turn. A multi-turn question (MT-Bench, Spec-Bench's first 80)
    has its second turn asked after the target's own on-policy answer to the first, as
    Spec-Bench's evaluation does; dataset references exist for the first turn only."""
    encoded = encode_prompts(target, prompts, cfg.max_new_tokens)
    if cfg.reference == "dataset":
        ds = dataset_references(target.tokenizer, prompts, cfg.max_new_tokens)
        if cfg.shard is not None:  # the other shards' prompts are scored there
            ds = [c if (i // cfg.batch_size) % cfg.shard[1] == cfg.shard[0] else [] for i, c in enumerate(ds)]
        return TurnReferences(list(prompts), encoded, ds)
    conts = generate_references(target, encoded, sampling, cfg, progress, shard=cfg.shard)
    out = TurnReferences(list(prompts), list(encoded), list(conts), bool(getattr(conts, "interrupted", False)), cut=getattr(conts, "cut", 0))
    tok = target.tokenizer
    answers = {p.id: [tok.decode(c, skip_special_tokens=True)] for p, c in zip(prompts, conts, strict=True) if c}
    ctx = getattr(target.config, "max_position_embeddings", None)
    turn = 1
    while not out.interrupted:
        later, enc, groups = [], [], []
        for i, p in enumerate(prompts):
            if p.num_turns > turn and len(answers.get(p.id, ())) == turn:
                e = encode_prompt(tok, p, turn, answers[p.id])
                if ctx and len(e) + cfg.max_new_tokens > ctx:
                    out.skipped += 1
                    continue
                later.append(p)
                enc.append(e)
                groups.append(i // cfg.batch_size)  # the first turn's batch: shards batch it alike
        if not later:
            break
        progress.note(f"turn {turn + 1}: {len(later)} prompts continue after the target's own answers")
        conts = generate_references(target, enc, sampling, cfg, progress, groups=groups, turn=turn)
        out.interrupted = bool(getattr(conts, "interrupted", False))
        out.cut += getattr(conts, "cut", 0)
        for p, e, c in zip(later, enc, conts, strict=True):
            if not c:
                continue
            out.items.append(replace(p, id=f"{p.id}#{turn + 1}"))
            out.encoded.append(e)
            out.conts.append(c)
            answers[p.id].append(tok.decode(c, skip_special_tokens=True))
        turn += 1
    if out.skipped:
        progress.note(f"{out.skipped} later turn(s) left out: with --max-new-tokens {cfg.max_new_tokens} they exceed the target's context of {ctx}")
    return out
