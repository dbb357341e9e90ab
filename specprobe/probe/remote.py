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
drafter's argmax is listed; at another temperature a range unless the whole vocabulary
was asked); two accumulators, low and high, give every table twice. The result's tables
are the low end; its `remote` section holds both ends, how many positions were exact,
and the cost of the exchange (requests, bytes, seconds, the scoring rate). KL and the
target's entropy need the whole distribution: left out (null), and said so.

The server's answers are kept per prompt as they arrive (`remote_cache`): a run cut
short by Ctrl-C or by the server going away continues when run again, and another
drafter scored against the same served target reuses them. The requests and the loop
are in `remote_scoring` (references, scores, widening).

Where the server also scores ids it is given (SGLang's `token_ids_logprob`), the
drafter runs first and its argmax over the reference is asked for beside the top-n: a
greedy drafting's acceptance p_target(argmax q) is then exact at every position, at
any n (the `chosen_ids` hook; probabilistic drafting keeps the top-n bounds).

Today: an independent drafter checkpoint (a self-draft needs the target's weights),
every turn of multi-turn prompts, a vLLM or SGLang server, a few requests at once; the cost ratio
and verify factor must be given (the target is not here to time)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from specprobe import __version__
from specprobe.core.environment import environment
from specprobe.core.errors import ConfigError, ServerError
from specprobe.core.progress import Progress
from specprobe.engines import GREEDY, get
from specprobe.judge.rules import RuleTable
from specprobe.metrics.accumulate import Accumulator
from specprobe.metrics.remote import FIELDS, LEFT_OUT, supported
from specprobe.models.drafters import drafter_kind_of
from specprobe.models.loader import cache_root, check_paths, load_model, local_spec
from specprobe.probe.alignment import effective_sampling
from specprobe.probe.assemble import (
    build_result,
    created_now,
    procedure_section,
    sampling_section,
    summarise,
)
from specprobe.probe.live import REQUEST_TIMEOUT_S, sampling_request
from specprobe.probe.references import encode_prompt, load_prompt_set
from specprobe.probe.remote_scoring import (
    References,
    ServerScoring,
    open_cache,
    probe_logprobs,
    server_references,
)
from specprobe.probe.scoring import Scored
from specprobe.probe.timing import cost_block
from specprobe.result import Result
from specprobe.settings.options import relabel_sources
from specprobe.settings.pipeline import DiagnoseConfig

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 1234567890 — naïve café, 東京."


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
    if cfg.target_widen and (cfg.target_logprobs < 0 or 0 <= cfg.target_widen <= cfg.target_logprobs):
        raise ConfigError(f"--target-widen {cfg.target_widen} asks no more than --target-logprobs {cfg.target_logprobs} already does",
                          "give --target-widen a larger top-n than --target-logprobs (-1: the whole vocabulary), or leave it out")


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
        raise ConfigError(f"--target-server: {why}", "score without --top-k/--top-p/--min-p (any --temperature), or load the target here")
    prompts = list(prompt_set.prompts)
    encoded = [encode_prompt(tok, p) for p in prompts]
    request = sampling_request(pair.target)
    for n in (cfg.target_logprobs, cfg.target_widen) if cfg.target_widen else (cfg.target_logprobs,):
        probe_logprobs(server, encoded, n)  # a cap below N: exit 2 now, before the references cost anything
    items, item_enc, conts, refs = _references_by_turn(server, cfg, tok, prompts, encoded, request, progress, label)
    cache = open_cache(server, cfg, [e + c for e, c in zip(item_enc, conts, strict=True)], {}, len(tok), progress, seed=0)
    chosen = chosen_ids(server, cfg, pair.target)
    if chosen:
        notes.append("the server scored the drafter's argmax at every position (its own token ids, asked beside the top-n): greedy drafting is exact"
                     + ("" if abs(pair.target.temperature - 1.0) <= 1e-9 else " up to the tempered normaliser, which the top-n bounds (exact positions counted below)"))
    s = ServerScoring(server, cfg, drafter, pair, cache, progress, vocab=len(tok), chosen=chosen)
    s.run(items, item_enc, conts)
    interrupted = refs.interrupted or s.interrupted
    if s.stopped is not None:
        stop = _kept(s.stopped, f"{s.low.num_prompts} of {len(items)} prompts scored", cfg.use_cache)
        if not s.low.num_prompts:
            raise stop
        progress.note(f"error: {stop.one_line()}")  # the run ends as an interrupted one: what was scored is written
        interrupted = True
    low, high, rows, positions, exact = s.low, s.high, s.rows, s.positions, s.exact
    requests, size, reference_s, scoring_s = s.requests, s.bytes, refs.seconds, s.seconds
    notes += s.notes

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
    section.update(s.extra())
    scored.remote = (section, {k: None for k in (*LEFT_OUT, "kl_target_draft_p90_nats", "tv_mean", "accept_prob_high_entropy")})
    if not section["exact"]:
        progress.note(f"--target-server: {exact} of {positions} positions exact; the tables are the low ends of each range (the result's `remote` section has both)")
    return build_result(header, {}, scored, cost, cfg, table, "independent", {"remote_target": [label, *notes]})


def _references_by_turn(server: Any, cfg: DiagnoseConfig, tok: Any, prompts: list[Any], encoded: list[list[int]], request: dict[str, Any], progress: Progress,
                        label: str) -> tuple[list[Any], list[list[int]], list[list[int]], References]:
    """The server's references for every turn: a later turn of a multi-turn question is
    asked after the server's own answer to the turns before (as Spec-Bench's evaluation
    does, and `diagnose` with the target here), as item "<id>#<turn>", seeded apart from
    the first turns. -> (items, their prompt ids, their references, the first turns'
    References with the seconds and interruptions of all)."""
    refs = server_references(server, encoded, cfg, request, open_cache(server, cfg, encoded, request, len(tok), progress), progress, label)
    if refs.stopped is not None:  # nothing to score with: what the server wrote is kept
        raise _kept(refs.stopped, f"{sum(1 for c in refs.conts if c)} of {len(prompts)} references written", cfg.use_cache)
    items, item_enc, conts = [p for p, c in zip(prompts, refs.conts, strict=True) if c], [e for e, c in zip(encoded, refs.conts, strict=True) if c], [c for c in refs.conts if c]
    answers = {p.id: [tok.decode(c, skip_special_tokens=True)] for p, c in zip(prompts, refs.conts, strict=True) if c}
    turn = 1
    while not refs.interrupted:
        later = [p for p in prompts if p.num_turns > turn and len(answers.get(p.id, ())) == turn]
        enc = [encode_prompt(tok, p, turn, answers[p.id]) for p in later]
        ctx = getattr(server, "max_model_len", None)
        fits = [ctx is None or len(e) + cfg.max_new_tokens <= ctx for e in enc]
        if not all(fits):
            progress.note(f"turn {turn + 1}: {fits.count(False)} prompt(s) left out: with --max-new-tokens {cfg.max_new_tokens} they exceed the server's context of {ctx}")
            later, enc = [p for p, f in zip(later, fits, strict=True) if f], [e for e, f in zip(enc, fits, strict=True) if f]
        if not later:
            break
        progress.note(f"turn {turn + 1}: {len(later)} prompts continue after the server's own answers")
        seed = cfg.seed + turn * 1_000_003
        got = server_references(server, enc, cfg, request, open_cache(server, cfg, enc, request, len(tok), progress, seed=seed), progress, label, seed=seed)
        if got.stopped is not None:
            raise _kept(got.stopped, f"turn {turn + 1}: {sum(1 for c in got.conts if c)} of {len(later)} references written", cfg.use_cache)
        refs.interrupted, refs.seconds = got.interrupted, refs.seconds + got.seconds
        for p, e, c in zip(later, enc, got.conts, strict=True):
            if c:
                items.append(replace(p, id=f"{p.id}#{turn + 1}"))
                item_enc.append(e)
                conts.append(c)
                answers[p.id].append(tok.decode(c, skip_special_tokens=True))
        turn += 1
    return items, item_enc, conts, refs


def _kept(e: ServerError, done: str, cached: bool) -> ServerError:
    """The server stopped answering: the error, what was done, and how to go on."""
    where = f" in {cache_root() / 'remote'}" if cached else ""
    kept = f"; what the server answered is kept{where}" if cached else ""
    again = "start it again and rerun the same command: it continues from there" if cached else "start it again and rerun (with --no-cache it starts over)"
    return ServerError(f"{e.message.rstrip('.')} — after {done}{kept}", again)


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
