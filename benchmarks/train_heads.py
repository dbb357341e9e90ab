"""Train real heads for SmolLM2-135M on a CPU, in minutes: an EAGLE-3 head (written in
the speculators layout vLLM loads) and Medusa heads (FasterDecoding's version-2 layout),
each on SmolLM2's own on-policy outputs for training prompts that are NOT the built-in
suite (so `diagnose` on the built-in suite scores held-out text).

  data     ~200 templated prompts (code, math, chat, summarization, translation, qa),
           continuations sampled from SmolLM2 at --temperature; the target's states
           (EAGLE-3's aux layers, the final hidden state) and its top-32 next-token
           distribution at every position, computed once and cached in --out.
  EAGLE-3  one layer over fc(aux states), trained through --ttt chained steps exactly as
           specprobe scores it (teacher-forced, the engines' attention pattern), KL to the
           target's distribution on a draft vocabulary of the --draft-vocab most frequent
           tokens (d2t/t2d written with it); the LM head starts from the target's rows.
  Medusa   --medusa-heads ResBlocks over the final hidden state, the target's LM head
           reused (version 2); head h learns the target's distribution of token t+2+h.

Checkpoints are written at each --save-at minute mark (e.g. a briefly and a longer
trained head), as `eagle3-<m>min` and `medusa-<m>min`. Then, for example:

  specprobe diagnose smollm2 heads/eagle3-8min --temperature 0.7 --k-max 4

Run: python benchmarks/train_heads.py --out heads [--save-at 1 8] [--which eagle3 medusa]
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOPICS = [
    "photosynthesis", "black holes", "the French revolution", "compound interest", "machine learning", "volcanoes",
    "the immune system", "climate change", "the printing press", "blockchains", "honey bees", "the water cycle",
    "jazz music", "plate tectonics", "vaccines", "the Roman empire", "solar panels", "sleep", "coffee", "chess",
]
CODE = [
    "reverses a linked list", "checks whether a number is prime", "counts word frequencies in a text", "merges two sorted lists",
    "computes the nth Fibonacci number iteratively", "flattens a nested list", "validates an email address with a regex",
    "finds the longest common prefix of strings", "converts Celsius to Fahrenheit", "removes duplicates while keeping order",
]
SENTENCES = [
    "The weather is lovely today.", "I would like a cup of tea, please.", "Where is the nearest train station?",
    "My brother works as a doctor in the city.", "We are going to the beach this weekend.", "This book changed my life.",
    "Could you help me carry these boxes?", "The museum opens at nine in the morning.",
]


def training_prompts() -> list[Any]:
    from specprobe.prompts import Prompt

    rng = random.Random(0)
    out: list[Any] = []

    def add(domain: str, text: str) -> None:
        out.append(Prompt(id=f"train-{len(out)}", domain=domain, category=domain, turns=(text,)))

    for t in TOPICS:
        add("chat", f"Explain {t} to a curious twelve-year-old.")
        add("qa", f"What are three surprising facts about {t}?")
        add("summarization", f"Write a short paragraph about {t}, then summarize it in one sentence.")
    for c in CODE:
        add("code", f"Write a Python function that {c}. Add a docstring.")
        add("code", f"Explain step by step how to write a program that {c}.")
    for s, lang in itertools.product(SENTENCES, ("French", "Spanish", "German")):
        add("translation", f"Translate into {lang}: {s}")
    for _ in range(40):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        add("math", rng.choice([f"What is {a} times {b}? Show your work.", f"A shop sells {a} apples a day for {c} days. How many apples is that?", f"Solve for x: {c}x + {a} = {b}."]))
    return out


# ----------------------------------------------------------------------------- data
def build_data(target: Any, out: Path, temperature: float, tokens: int, aux: tuple[int, ...], max_prompts: int | None = None, gen_batch: int = 16) -> dict[str, Any]:
    """On-policy sequences and the target's states + top-32 distribution at each position."""
    import torch

    from specprobe.core.progress import Progress
    from specprobe.models.anatomy import capture_layers
    from specprobe.probe.alignment import effective_sampling
    from specprobe.probe.references import encode_prompts, generate_references
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags

    cache = out / "train-data.pt"
    if cache.is_file():
        return torch.load(cache, weights_only=True)
    prompts = training_prompts()
    if max_prompts:
        prompts = random.Random(1).sample(prompts, min(max_prompts, len(prompts)))
    enc = encode_prompts(target, prompts, tokens)
    cfg = DiagnoseConfig(target="smollm2", drafter="self", max_new_tokens=tokens, batch_size=gen_batch, seed=1, use_cache=False, sampling=SamplingFlags(temperature=temperature))
    samp = effective_sampling(cfg.sampling, target.info.generation_config, None).target
    t0 = time.perf_counter()
    conts = generate_references(target, enc, samp, cfg, Progress())
    print(f"generated {sum(map(len, conts))} on-policy tokens for {len(prompts)} prompts in {time.perf_counter() - t0:.0f} s")
    seqs = [e + c for e, c in zip(enc, conts, strict=True) if c]
    starts = [len(e) - 1 for e, c in zip(enc, conts, strict=True) if c]  # first position whose next token is generated
    width = max(map(len, seqs))
    n = len(seqs)
    ids = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.bool)  # positions whose next token is on-policy
    for i, (s, p0) in enumerate(zip(seqs, starts, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        loss_mask[i, p0 : len(s) - 1] = True
    h = target.config.hidden_size
    aux_states = torch.zeros((n, width, len(aux) * h), dtype=torch.bfloat16)
    last = torch.zeros((n, width, h), dtype=torch.bfloat16)
    top_ids = torch.zeros((n, width, 32), dtype=torch.int32)
    top_p = torch.zeros((n, width, 32), dtype=torch.float16)
    with torch.inference_mode():
        for b0 in range(0, n, 8):
            x = ids[b0 : b0 + 8]
            m = torch.ones_like(x)  # right padding: causal attention never looks past a row's end
            with capture_layers(target.model, tuple(k for k in aux if k >= 1)) as cap:
                hs = target.model.model(input_ids=x, attention_mask=m).last_hidden_state
            states = [cap[k] if k >= 1 else target.model.get_input_embeddings()(x) for k in aux]
            aux_states[b0 : b0 + 8] = torch.cat(states, dim=-1).to(torch.bfloat16)
            last[b0 : b0 + 8] = hs.to(torch.bfloat16)
            p = torch.softmax(target.head(hs) / temperature, dim=-1)  # the target's sampling distribution
            tp, ti = p.topk(32, dim=-1)
            top_ids[b0 : b0 + 8], top_p[b0 : b0 + 8] = ti.to(torch.int32), tp.to(torch.float16)
    data = {"ids": ids, "loss_mask": loss_mask, "aux": aux_states, "last": last, "top_ids": top_ids, "top_p": top_p}
    out.mkdir(parents=True, exist_ok=True)
    torch.save(data, cache)
    return data


def soft_targets(top_ids: Any, top_p: Any, index: Any, size: int) -> Any:
    """[..., 32] target ids/probs -> [..., size] distribution over a (draft) vocabulary;
    index maps a target id to its slot (−1: outside), mass outside is dropped and the rest
    renormalised."""
    import torch

    slot = index[top_ids.long()]  # [..., 32]
    keep = slot >= 0
    dist = torch.zeros((*top_ids.shape[:-1], size), dtype=torch.float32)
    dist.scatter_add_(-1, slot.clamp(min=0).long(), top_p.float() * keep)
    return dist / dist.sum(-1, keepdim=True).clamp(min=1e-9)


# ----------------------------------------------------------------------------- EAGLE-3
def train_eagle3(target: Any, data: dict[str, Any], out: Path, args: argparse.Namespace, aux: tuple[int, ...]) -> None:
    import torch

    from specprobe.models.heads.chain import shifted_tokens
    from specprobe.models.heads.export import eagle3_layer_config, write_eagle3_speculators
    from specprobe.models.heads.layers import Eagle3Head

    ids, mask = data["ids"], data["loss_mask"]
    v = target.vocab_size
    counts = torch.bincount(data["top_ids"][mask].long().flatten(), weights=data["top_p"][mask].float().flatten(), minlength=v)
    draft = counts.topk(args.draft_vocab).indices.sort().values  # [Vd] most probable target ids
    index = torch.full((v,), -1, dtype=torch.long)
    index[draft] = torch.arange(draft.shape[0])
    cfg = eagle3_layer_config(target.config)
    h = int(cfg["hidden_size"])
    torch.manual_seed(0)
    head = Eagle3Head(cfg, h, len(aux) * h, int(draft.shape[0]), norm_before_residual=False)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.model.get_output_embeddings().weight[draft])
        head.norm.weight.copy_(target.model.model.norm.weight)
    embed = target.model.get_input_embeddings()
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    marks = sorted(args.save_at_steps or args.save_at)
    n, width = ids.shape
    t0, step = time.perf_counter(), 0
    rng = torch.Generator().manual_seed(0)
    while marks:
        rows = torch.randint(0, n, (args.batch,), generator=rng)
        x, m = ids[rows], mask[rows]
        first = head.fc(data["aux"][rows].float())
        cache: list[Any] = []
        hidden, loss = first, torch.zeros(())
        for j in range(args.ttt):
            with torch.no_grad():
                e = embed(shifted_tokens(x, j))
            hidden, normed = head.step(e, hidden, j, cache)
            logq = torch.log_softmax(head.lm_head(normed), dim=-1)  # [B, S, Vd]
            # slot i, step j predicts token i+2+j: the target's distribution at position i+1+j
            k = 1 + j
            tgt = soft_targets(data["top_ids"][rows][:, k:], data["top_p"][rows][:, k:], index, int(draft.shape[0]))
            valid = m[:, k:]
            loss = loss - ((tgt * logq[:, : width - k]).sum(-1) * valid).sum() / valid.sum().clamp(min=1) * (0.8**j)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        # the default layers (2, L//2, L−3) are written as no ids: vLLM and SGLang then agree
        step = _step("eagle3", opt, loss, step, t0, marks, args, lambda mark: write_eagle3_speculators(out / f"eagle3-{_label(mark, args)}", head, cfg, draft, v, aux_ids=None, verifier="HuggingFaceTB/SmolLM2-135M-Instruct", verifier_architectures=list(target.config.architectures or [])))


# ----------------------------------------------------------------------------- Medusa
def train_medusa(target: Any, data: dict[str, Any], out: Path, args: argparse.Namespace) -> None:
    import torch
    from torch import nn

    from specprobe.models.heads.export import write_medusa_fasterdecoding

    ids, mask = data["ids"], data["loss_mask"]
    v, h = target.vocab_size, target.config.hidden_size
    identity = torch.arange(v)
    blocks = nn.ModuleList([nn.ModuleList([nn.Linear(h, h)]) for _ in range(args.medusa_heads)])
    with torch.no_grad():
        for seq in blocks:
            seq[0].weight.zero_()  # FasterDecoding starts each ResBlock as the identity
            seq[0].bias.zero_()
    opt = torch.optim.AdamW(blocks.parameters(), lr=args.lr, weight_decay=0.0)
    marks = sorted(args.save_at_steps or args.save_at)
    n, width = ids.shape
    t0, step = time.perf_counter(), 0
    rng = torch.Generator().manual_seed(1)
    pos = mask.nonzero()  # [P, 2] positions whose next token is on-policy
    while marks:
        pick = pos[torch.randint(0, pos.shape[0], (args.medusa_positions,), generator=rng)]
        r, t = pick[:, 0], pick[:, 1]
        x = data["last"][r, t].float()  # [N, H] the target's final state at t
        loss = torch.zeros(())
        for hd, seq in enumerate(blocks):
            k = t + 1 + hd  # head hd predicts token t+2+hd: the target's distribution at t+1+hd
            ok = (k < width) & mask[r, k.clamp(max=width - 1)]
            if not bool(ok.any()):
                continue
            y = x[ok]
            for lin in seq:
                y = y + torch.nn.functional.silu(lin(y))
            logq = torch.log_softmax(target.head(y).float(), dim=-1)
            tgt = soft_targets(data["top_ids"][r[ok], k[ok]], data["top_p"][r[ok], k[ok]], identity, v)
            loss = loss - (tgt * logq).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        step = _step("medusa", opt, loss, step, t0, marks, args, lambda mark: write_medusa_fasterdecoding(out / f"medusa-{_label(mark, args)}", blocks, num_layers=1, base_model="HuggingFaceTB/SmolLM2-135M-Instruct"))


def _label(mark: float, args: argparse.Namespace) -> str:
    """A checkpoint's name after its mark: `8min`, or `60steps` under --save-at-steps."""
    return f"{mark:g}steps" if args.save_at_steps else f"{mark:g}min"


def _step(name: str, opt: Any, loss: Any, step: int, t0: float, marks: list[float], args: argparse.Namespace, write: Callable[[float], Path]) -> int:
    """One optimizer step -> the step count; every 10 a progress line, and a checkpoint
    (`write(mark)`) at each mark passed: minutes of training, or with --save-at-steps
    optimizer steps (the same head on any machine, however loaded)."""
    opt.step()
    step += 1
    elapsed = (time.perf_counter() - t0) / 60
    if step % 10 == 0:
        print(f"{name} step {step:4d}  {elapsed:5.1f} min  loss {float(loss.detach()):.3f}")
    while marks and (step if args.save_at_steps else elapsed) >= marks[0]:
        dest = write(marks[0])
        print(f"wrote {dest} after {step} steps")
        marks.pop(0)
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("heads"))
    ap.add_argument("--which", nargs="+", default=["eagle3", "medusa"], choices=["eagle3", "medusa"])
    ap.add_argument("--save-at", nargs="+", type=float, default=[1.0, 8.0], help="minutes of training at which to write a checkpoint")
    ap.add_argument("--save-at-steps", nargs="+", type=int, default=None,
                    help="instead of --save-at: optimizer steps at which to write a checkpoint, named <head>-<N>steps (reproducible whatever the machine's load)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--tokens", type=int, default=96, help="on-policy tokens per training prompt")
    ap.add_argument("--prompts", type=int, default=None, help="use this many of the training prompts (default: all)")
    ap.add_argument("--gen-batch", type=int, default=16, help="prompts per generation batch")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--ttt", type=int, default=3, help="EAGLE-3 chained training steps (depths)")
    ap.add_argument("--batch", type=int, default=8, help="EAGLE-3 sequences per step")
    ap.add_argument("--medusa-heads", type=int, default=3)
    ap.add_argument("--medusa-positions", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()

    import torch

    from specprobe.models.heads.layout import default_aux_layers
    from specprobe.models.loader import load_model

    torch.manual_seed(0)
    target = load_model("smollm2", "cpu", "float32")
    target.model.requires_grad_(False)
    aux = default_aux_layers(target.num_layers)  # (2, 15, 27): both engines' default
    data = build_data(target, args.out, args.temperature, args.tokens, aux, args.prompts, args.gen_batch)
    print(f"data: {int(data['loss_mask'].sum())} on-policy positions in {data['ids'].shape[0]} sequences; {torch.get_num_threads()} threads")
    if "eagle3" in args.which:
        train_eagle3(target, data, args.out, args, aux)
    if "medusa" in args.which:
        train_medusa(target, data, args.out, args)
    last = max(args.save_at_steps or args.save_at)
    print(f"done; e.g. specprobe diagnose smollm2 {args.out}/eagle3-{_label(last, args)} --temperature {args.temperature} --k-max 4")


if __name__ == "__main__":
    main()
