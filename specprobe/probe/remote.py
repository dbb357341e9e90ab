"""`diagnose --target-server URL DRAFTER`: the target is an engine's server, the drafter
runs here.

For targets too big for this machine, the engine that already serves them is the
target. The server writes the on-policy references itself (its `complete`, on the
run's token ids, with the run's sampling and seeds) and scores them teacher-forced: the
prompt and its reference go back as ids with `prompt_logprobs: n`, and per position it
returns the actual token's logprob and the target's top-n. The drafter's logits over the
same ids are computed here, as `diagnose` computes them (its own forward pass and head).

`metrics.remote` turns each position into acceptance at both ends (exact where the
listed tokens decide it: at T = 0 always, at T = 1 with greedy drafting where the
drafter's argmax is listed); two accumulators, low and high, give every table twice.
The result's tables are the low end; its `remote` section holds both ends, how many
positions were exact, and the cost of the exchange (requests, bytes, seconds). KL and
the target's entropy need the whole distribution: left out (null), and said so.

Where the server also scores ids it is given (SGLang's `token_ids_logprob`), the
drafter runs first and its argmax over the reference is asked for beside the top-n: a
greedy drafting's acceptance p_target(argmax q) is then exact at every position, at
any n (the `chosen_ids` hook; probabilistic drafting keeps the top-n bounds).

Today: an independent drafter checkpoint (a self-draft needs the target's weights),
single-turn prompts, a vLLM or SGLang server, IN_FLIGHT requests at once (references and
scores); the cost ratio and verify factor must be given (the
target is not here to time)."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import torch

from specprobe import __version__
from specprobe.core.environment import environment
from specprobe.core.errors import ConfigError
from specprobe.core.progress import Progress
from specprobe.engines import GREEDY, get
from specprobe.judge.rules import RuleTable
from specprobe.metrics.accumulate import Accumulator
from specprobe.metrics.remote import FIELDS, LEFT_OUT, TopN, bounded_metrics, supported
from specprobe.models.drafters import drafter_kind_of
from specprobe.models.loader import check_paths, load_model, local_spec
from specprobe.probe.alignment import effective_sampling
from specprobe.probe.assemble import (
    build_result,
    created_now,
    procedure_section,
    sampling_section,
    summarise,
)
from specprobe.probe.chunks import ROW_FIELDS
from specprobe.probe.live import REQUEST_TIMEOUT_S, sampling_request
from specprobe.probe.references import encode_prompt, load_prompt_set
from specprobe.probe.scoring import Scored
from specprobe.probe.timing import cost_block
from specprobe.result import Result
from specprobe.settings.options import relabel_sources
from specprobe.settings.pipeline import DiagnoseConfig

T = TypeVar("T")
IN_FLIGHT = 4  # requests at once (the server batches them; one more waits while the drafter runs here)
PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 1234567890 — naïve café, 東京."


def in_order(ask: Callable[[int], T], items: Iterable[int], in_flight: int = IN_FLIGHT) -> Iterator[T]:
    """ask(i) for every item, up to `in_flight` requests at once, answers in the items'
    order. Leaving early (an error, Ctrl-C) cancels what was not sent yet."""
    pool = ThreadPoolExecutor(max_workers=in_flight)
    pending: deque[Future[T]] = deque()
    it = iter(items)
    try:
        for i in it:
            pending.append(pool.submit(ask, i))
            if len(pending) >= in_flight:
                break
        while pending:
            got = pending.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(pool.submit(ask, nxt))
            yield got
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def refuse(cfg: DiagnoseConfig) -> None:
    """What --target-server cannot run, said before anything loads."""
    kind = drafter_kind_of(cfg.drafter)
    if kind != "independent" or cfg.drafter == "self":
        raise ConfigError(f"--target-server scores a drafter checkpoint of its own; {cfg.drafter} ({kind}) needs the target's weights or hidden states",
                          "pass the drafter's checkpoint folder (a self-draft or a head needs the target loaded here: leave out --target-server)")
    if cfg.cost_ratio is None or cfg.verify_factor is None:
        raise ConfigError("--target-server cannot time the target: the cost ratio and verify factor must be given",
                          "add --cost-ratio C --verify-factor V (from the serving stack's own timings)")
    for flag, on in (("--against", cfg.against), ("--shard", cfg.shard), ("--context-lengths", cfg.context_lengths), ("--tree", cfg.tree),
                     ("--target-quant", cfg.target_quant), ("--draft-quant", cfg.draft_quant), ("--kv-cache-dtype", cfg.kv_cache_dtype), ("--device-map", cfg.device_map)):
        if on:
            raise ConfigError(f"{flag} does not combine with --target-server yet", f"leave out {flag}")
    if cfg.reference == "dataset":
        raise ConfigError("--target-server writes on-policy references on the server", "leave out --reference dataset")


def _tokenizer(name: str, offline: bool) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=offline)
    except Exception as e:  # noqa: BLE001 - any failure is the same advice
        raise ConfigError(f"cannot load the served target's tokenizer {name!r} ({type(e).__name__}: {str(e)[:120]})",
                          "give the target's tokenizer (a folder or hub id) as TARGET: specprobe diagnose TARGET DRAFTER --target-server URL") from None


def _generation_config(name: str) -> Any:
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(name, local_files_only=True)
    except Exception:  # noqa: BLE001 - none: the engine's defaults, as for a model without one
        return None


def check_tokenizers(server: Any, tok: Any, draft_tok: Any, timeout: float) -> list[str]:
    """The server's ids, the tokenizer's and the drafter's agree on a probe text; notes."""
    local = tok.encode(PROBE_TEXT, add_special_tokens=False)
    served = server.tokenize(PROBE_TEXT, timeout)
    notes = []
    if served is None:
        notes.append("the server has no /tokenize: its ids were not checked against the tokenizer's")
    elif served != local:
        raise ConfigError(f"the server's token ids for a probe text differ from the tokenizer's ({len(served)} vs {len(local)} tokens; first {served[:6]} vs {local[:6]})",
                          "give the served target's own tokenizer as TARGET (the folder or hub id the server loaded)")
    if draft_tok.encode(PROBE_TEXT, add_special_tokens=False) != local:
        raise ConfigError("the drafter's tokenizer writes other ids than the served target's for a probe text",
                          "--target-server compares ids one for one: use a drafter with the target's tokenizer")
    return notes


def chosen_ids(server: Any, cfg: DiagnoseConfig, target: Any) -> bool:
    """Whether to ask the server for the drafter's own argmax ids beside the top-n: where
    it scores ids it is given (SGLang's token_ids_logprob), the drafting is greedy and the
    target samples (at T = 0 rank 1 already decides every position)."""
    return bool(getattr(server, "scores_chosen", False)) and cfg.drafting == GREEDY and not target.greedy


def run_remote(cfg: DiagnoseConfig, progress: Progress, table: RuleTable) -> Result:
    """The whole --target-server run -> its result."""
    assert cfg.target_server is not None
    refuse(cfg)
    prompt_set = load_prompt_set(cfg)
    progress.note(f"prompts from {prompt_set.name}: {prompt_set.description}")
    server = get(cfg.engine).live_server(cfg.target_server, cfg.target_model)
    label = f"{server.engine.label} {server.version or ''} at {server.url} serving {server.model}"
    progress.note(f"--target-server: {label}")
    tok_name = cfg.target or server.tokenizer_name or server.model
    tok = _tokenizer(tok_name, cfg.offline)
    if cfg.target_logprobs > len(tok):
        raise ConfigError(f"--target-logprobs {cfg.target_logprobs} asks for more tokens per position than the target's vocabulary ({len(tok)})",
                          "lower --target-logprobs (-1 asks for the whole vocabulary where the engine allows it)")
    if cfg.target_logprobs < 0 and not server.lists_every_token:
        raise ConfigError(f"{server.engine.label}'s API has no 'every token' setting for --target-logprobs -1",
                          f"give --target-logprobs N: the top-N (at most the vocabulary, {len(tok)})")
    dspec = local_spec(cfg.drafter, cfg.draft_revision, cfg.offline, progress.note)
    check_paths(None, dspec)
    progress.note(f"loading drafter {cfg.drafter}")
    drafter = load_model(dspec, cfg.device, cfg.dtype, progress, gguf_weights=cfg.gguf_weights)
    notes = check_tokenizers(server, tok, drafter.tokenizer, REQUEST_TIMEOUT_S)
    pair = effective_sampling(cfg.sampling, _generation_config(tok_name), drafter.info.generation_config, engine=cfg.engine, drafting=cfg.drafting)
    pair.sources = relabel_sources(pair.sources, cfg.sampling_origins)
    why = supported(pair.target)
    if why is not None:
        raise ConfigError(f"--target-server: {why}", "score at --temperature 0 or 1 without --top-k/--top-p/--min-p, or load the target here")
    prompts = list(prompt_set.prompts)
    if any(p.num_turns > 1 for p in prompts):
        notes.append("multi-turn prompts: only their first turn is scored")
    encoded = [encode_prompt(tok, p) for p in prompts]

    # references: the server writes them (the run's sampling, one seed per prompt)
    request = sampling_request(pair.target)
    t0 = time.perf_counter()
    conts: list[list[int]] = []
    interrupted = False
    with progress.task(f"references from {label}", len(encoded)) as advance:
        try:
            for cont in in_order(lambda i: server.complete(encoded[i], cfg.max_new_tokens, request, cfg.seed + i, timeout=REQUEST_TIMEOUT_S), range(len(encoded))):
                conts.append(cont)
                advance()
        except KeyboardInterrupt:
            interrupted = True
            progress.note(f"interrupted while the server wrote references: scoring the {len(conts)} prompts that have one")
    conts += [[] for _ in range(len(encoded) - len(conts))]
    reference_s = time.perf_counter() - t0

    # scoring: the server's prompt logprobs, the drafter's logits here
    def acc() -> Accumulator:
        return Accumulator(k_max=cfg.k_max, drafting=cfg.drafting, p_min=cfg.draft_p_min, n_min=cfg.draft_n_min,
                           threshold_single=cfg.accept_threshold_single, threshold_acc=cfg.accept_threshold_acc)

    low, high = acc(), acc()
    rows: dict[str, list[Any]] = {k: [] for k in ("prompt_id", "domain", "position", *ROW_FIELDS)}
    exact = positions = requests = size = 0
    order = [i for i in range(len(prompts)) if conts[i]]
    chosen = chosen_ids(server, cfg, pair.target)
    if chosen:
        notes.append("the server scored the drafter's argmax at every position (its own token ids, asked beside the top-n): greedy drafting is exact")
    t1 = time.perf_counter()
    with progress.task(f"scoring {sum(len(conts[i]) for i in order)} positions on the server", len(order)) as advance:
        try:
            lock = threading.Lock()

            def draft(i: int) -> torch.Tensor:
                """[n, V'] the drafter's logits predicting prompt i's reference tokens."""
                enc, cont = encoded[i], conts[i]
                with lock, torch.inference_mode():
                    x = torch.tensor([enc + cont], device=drafter.device)
                    hidden = drafter.last_hidden(x, torch.ones_like(x))
                    return drafter.head(hidden[0, len(enc) - 1 : len(enc) - 1 + len(cont)]).float()

            def ask(i: int) -> tuple[Any, torch.Tensor | None]:
                full = encoded[i] + conts[i]
                if not chosen:
                    return server.prompt_logprobs(full, cfg.target_logprobs, REQUEST_TIMEOUT_S), None
                dl = draft(i)  # the drafter first: its argmax is what the server scores
                ids = sorted({t for t in dl.argmax(-1).tolist() if t < len(tok)})
                return server.prompt_logprobs_chosen(full, cfg.target_logprobs, ids, REQUEST_TIMEOUT_S), dl

            for i, (scores, dl) in zip(order, in_order(ask, order), strict=False):
                p, enc, cont = prompts[i], encoded[i], conts[i]
                requests, size = requests + 1, size + scores.bytes
                got = scores.rows[len(enc) - 1 : len(enc) - 1 + len(cont)]  # row k: the token at k + 1
                for j, (r, t) in enumerate(zip(got, cont, strict=True)):
                    if t not in r:
                        raise ConfigError(f"the server's scores for prompt {p.id} do not list the token sent at position {len(enc) + j} ({t})",
                                          "the server re-tokenised the prompt: check that it takes token ids (vLLM's /v1/completions does)")
                top = TopN.from_rows(got, cfg.target_logprobs)
                dl = draft(i) if dl is None else dl
                b = bounded_metrics(top, dl, pair.target, pair.draft, greedy_drafting=cfg.drafting == GREEDY)
                pos = np.arange(len(enc), len(enc) + len(cont))
                low.add_sequence(p.domain, pos, b.low, category=p.category)
                high.add_sequence(p.domain, pos, b.high, category=p.category)
                exact += int(b.exact.sum())
                positions += len(cont)
                if cfg.keep_positions:
                    rows["prompt_id"].extend([p.id] * len(cont))
                    rows["domain"].extend([p.domain] * len(cont))
                    rows["position"].extend(pos.tolist())
                    for f in ROW_FIELDS:
                        rows[f].extend([None] * len(cont) if f in LEFT_OUT else np.round(b.low[f], 6).tolist())
                advance()
        except KeyboardInterrupt:
            interrupted = True
            progress.note(f"interrupted: keeping the {low.num_prompts} prompts scored")
    scoring_s = time.perf_counter() - t1

    header = {
        "command": "diagnose",
        "specprobe_version": __version__,
        "created": created_now(),
        "config": cfg.to_dict(),
        "environment": environment(drafter.device, drafter.dtype),
        "target": {"spec": cfg.target or server.model, "name": server.model, "vocab_size": len(tok)},
        "drafter": {"spec": cfg.drafter, "kind": "independent", "name": drafter.name, "num_layers": drafter.num_layers, "params": drafter.params},
        "prompt_set": {"name": prompt_set.name, "source": prompt_set.source, "sha256": prompt_set.sha256, "num_prompts": len(prompt_set.prompts), "domains": prompt_set.domains},
        "reference": "on-policy",
        "sampling": sampling_section(pair),
        "procedure": procedure_section(cfg.engine, cfg.drafting, p_min=cfg.draft_p_min, n_min=cfg.draft_n_min, thresholds=cfg.thresholds),
    }
    cost = cost_block(None, None, cfg.cost_ratio, verify_factor=cfg.verify_factor, k_max=cfg.k_max, batch_sizes=cfg.cost_batch_sizes())
    scored = Scored(low, rows, interrupted)
    hi_sections = summarise(Scored(high, {}), cost, cfg)
    lo_sections = summarise(Scored(low, {}), cost, cfg)
    section = remote_section(server, cfg, (low, high), lo_sections, hi_sections, positions, exact, requests, size, reference_s, scoring_s, notes)
    scored.remote = (section, {k: None for k in (*LEFT_OUT, "kl_target_draft_p90_nats", "tv_mean", "accept_prob_high_entropy")})
    if not section["exact"]:
        progress.note(f"--target-server: {exact} of {positions} positions exact; the tables are the low ends of each range (the result's `remote` section has both)")
    return build_result(header, {}, scored, cost, cfg, table, "independent", {"remote_target": [label, *notes]})


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _greedy_mean(acc: Accumulator) -> float | None:
    """Mean p_target(argmax q) over the positions scored."""
    n = acc.num_positions
    return _num(float(acc.overall[1 + FIELDS.index("accept_prob_greedy_draft")] / n)) if n else None


def remote_section(server: Any, cfg: DiagnoseConfig, accs: tuple[Accumulator, Accumulator], lo: dict[str, Any], hi: dict[str, Any], positions: int, exact: int, requests: int, size: int,
                   reference_s: float, scoring_s: float, notes: list[str]) -> dict[str, Any]:
    """Both ends of the estimate -> the result's `remote` section."""
    key = "accept_prob_engine_mean"
    ks = []
    for a, b in zip(lo["k_table"], hi["k_table"], strict=True):
        ks.append({"k": a["k"], "tau_low": _num(a.get("tau_renewal_tokens")), "tau_high": _num(b.get("tau_renewal_tokens")),
                   "accept_rate_low": _num(a.get("accept_rate_renewal")), "accept_rate_high": _num(b.get("accept_rate_renewal")),
                   "speedup_low": _num(a.get("speedup")), "speedup_high": _num(b.get("speedup"))})
    return {
        "url": server.url,
        "model": server.model,
        "engine": server.engine.name,
        "engine_version": server.version,
        "logprobs": cfg.target_logprobs,
        "positions": positions,
        "exact_positions": exact,
        "exact": exact == positions,
        "accept_low": _num(lo["metrics"].get(key)),
        "accept_high": _num(hi["metrics"].get(key)),
        "greedy_draft_low": _greedy_mean(accs[0]),
        "greedy_draft_high": _greedy_mean(accs[1]),
        "cumulative_low": [_num(x) for x in lo["depth"]["cumulative"]],
        "cumulative_high": [_num(x) for x in hi["depth"]["cumulative"]],
        "k_table": ks,
        "best_k_low": lo["metrics"].get("best_k"),
        "best_k_high": hi["metrics"].get("best_k"),
        "left_out": [*LEFT_OUT, "kl_target_draft_p90_nats", "tv_mean", "accept_prob_high_entropy"],
        "requests": requests,
        "bytes": size,
        "reference_s": reference_s,
        "scoring_s": scoring_s,
        "positions_per_s": positions / scoring_s if scoring_s > 0 else None,
        "notes": notes,
    }
