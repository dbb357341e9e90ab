"""vLLM's OpenAI-compatible server (`vllm serve`, `python -m vllm.entrypoints.openai.api_server`)
as a live server: its models (`/v1/models`), release (`/version`), speculative-decoding
counters (`/metrics`) and completions on token ids (`/v1/completions` takes a list of ids
as the prompt, so the server sees exactly the ids specprobe scored).

The counters are vLLM V1's `vllm:spec_decode_num_drafts`, `…_num_draft_tokens`,
`…_num_accepted_tokens` and `…_num_accepted_tokens_per_pos` (label `position`, 0-based),
summed over every label set the server exposes (one per model and engine index).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specprobe.core.errors import ConfigError, ServerError
from specprobe.engines import http  # the engines' shared HTTP client
from specprobe.engines.base import Engine, LiveServer, PromptScores, SpecCounters

PREFIX = "vllm:spec_decode_"
DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS = (PREFIX + n for n in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"))


def counters_from_text(text: str) -> SpecCounters:
    """The counters as vLLM's /metrics text states them (Prometheus text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    tot = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    pos: dict[int, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if not s.name.endswith("_total"):
                    continue
                base = s.name[: -len("_total")]
                if base == PER_POS:
                    i = int(s.labels.get("position", 0))
                    pos[i] = pos.get(i, 0.0) + float(s.value)
                elif base in tot:
                    tot[base] += float(s.value)
    except ValueError as e:
        raise ServerError(f"vLLM's /metrics is not Prometheus text ({e})", "check the URL: it must be the vLLM server itself") from None
    n = max(pos) + 1 if pos else 0
    return SpecCounters(tot[DRAFTS], tot[DRAFT_TOKENS], tot[ACCEPTED], tuple(pos.get(i, 0.0) for i in range(n)))


def response_counters(out: Mapping[str, Any], url: str) -> SpecCounters | None:
    """A completion's own counters: `metrics.speculative_decoding` (earlier builds of the
    feature: the choice's `speculative_decoding_stats`), read as `monitor --requests`
    reads a saved response; None where the answer has neither."""
    from specprobe.engines.vllm.monitor import read_request
    from specprobe.monitor.records import MalformedLine

    metrics = out.get("metrics")
    found = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    where = "metrics.speculative_decoding"
    if not isinstance(found, Mapping):
        choices = out.get("choices")
        found = choices[0].get("speculative_decoding_stats") if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else None
        where = "choices[0].speculative_decoding_stats"
    if not isinstance(found, Mapping):
        return None
    try:
        rec = read_request(dict(found), None, where)
    except MalformedLine as e:
        raise ServerError(f"vLLM at {url} answered a completion with unreadable counters: {e}", "check the server's release; start it without --per-request-spec-decode-metrics to count by /metrics") from None
    if rec.drafted is None or rec.steps is None:
        return None  # too little said to count drafts and draft tokens: the totals count it
    return SpecCounters(float(rec.steps), float(rec.drafted), float(rec.accepted), tuple(float(a) for a in rec.accepted_per_pos))


class VllmServer(LiveServer):
    def __init__(self, engine: Engine, url: str, model: str | None, timeout: float) -> None:
        self.engine, self.url, self.timeout = engine, url.rstrip("/"), timeout
        self.model, card = http.served_model(self.url, model, timeout=timeout, what="vLLM")
        # vLLM's `root`: the checkpoint (a path or a hub id) its tokenizer came from
        self.tokenizer_name = str(card["root"]) if card.get("root") else None
        # its context (prompt + answer) in tokens, as it reports it
        self.max_model_len = int(card["max_model_len"]) if isinstance(card.get("max_model_len"), int) else None
        try:
            got = http.get_json(self.url + "/version", timeout=timeout, what="vLLM")
            self.version = str(got.get("version")) if isinstance(got, dict) and got.get("version") else None
        except ServerError:
            self.version = None  # an older server without /version: no known-issue check

    def counters(self) -> SpecCounters:
        text = http.get_text(self.url + "/metrics", timeout=self.timeout, what="vLLM")
        c = counters_from_text(text)
        if PREFIX + "num_drafts" not in text:
            raise ConfigError(f"the server at {self.url} reports no speculative decoding (no {DRAFTS} in /metrics)", "start it with --speculative-config (and without --disable-log-stats)")
        return c

    def complete(self, prompt: Sequence[int], max_tokens: int, sampling: Mapping[str, float], seed: int, timeout: float) -> list[int]:
        return self.complete_counted(prompt, max_tokens, sampling, seed, timeout)[0]

    def complete_counted(self, prompt: Sequence[int], max_tokens: int, sampling: Mapping[str, float], seed: int, timeout: float) -> tuple[list[int], SpecCounters | None]:
        """The completion's token ids and, from a server started with
        `--per-request-spec-decode-metrics summary|detailed`, its own counters (the
        answer's `metrics.speculative_decoding`; None without that flag)."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [int(t) for t in prompt],
            "max_tokens": int(max_tokens),
            "temperature": float(sampling.get("temperature", 1.0)),
            "top_p": float(sampling.get("top_p", 1.0)),
            "top_k": int(sampling.get("top_k", 0)) or -1,  # vLLM: -1 is off
            "min_p": float(sampling.get("min_p", 0.0)),
            "seed": int(seed),
            "return_token_ids": True,
        }
        out = http.post_json(self.url + "/v1/completions", body, timeout=timeout, what="vLLM")
        try:
            choice = out["choices"][0]
            ids = [int(t) for t in choice.get("token_ids") or []]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"vLLM at {self.url} answered a completion without choices ({str(out)[:120]})", "check the server's log") from None
        return ids, response_counters(out, self.url)

    def prompt_logprobs(self, ids: Sequence[int], n: int, timeout: float) -> PromptScores:
        """`/v1/completions` with the ids as the prompt, `max_tokens: 1` and
        `prompt_logprobs: n`: per prompt position after the first, the actual token's
        logprob and rank and the top-n (the raw distribution, vLLM's default logprobs_mode).
        n above the server's --max-logprobs: a ConfigError naming it."""
        body: dict[str, Any] = {"model": self.model, "prompt": [int(t) for t in ids], "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": int(n)}
        url = self.url + "/v1/completions"
        try:
            out, size = http.post_json_sized(url, body, timeout=timeout, what="vLLM")
        except ServerError as e:
            if "max allowed" in str(e) or "max_logprobs" in str(e):
                raise ConfigError(f"vLLM at {self.url} caps logprobs below the {n} asked for ({str(e).rsplit(': ', 1)[-1]})",
                                  "restart it with --max-logprobs N (N ≥ --target-logprobs; -1: the whole vocabulary), or lower --target-logprobs") from None
            raise
        try:
            got = out["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise ServerError(f"vLLM at {self.url} answered without prompt_logprobs ({str(out)[:120]})", "check that the server is vLLM ≥ 0.6 with its OpenAI-compatible completions API") from None
        if not isinstance(got, list) or len(got) != len(ids):
            raise ServerError(f"vLLM at {self.url} scored {len(got) if isinstance(got, list) else 0} prompt positions of the {len(ids)} sent", "check the server's log (max_model_len?)")
        rows: list[dict[int, tuple[float, int]]] = []
        for entry in got[1:]:
            if not isinstance(entry, dict):
                raise ServerError(f"vLLM at {self.url} left a prompt position unscored", "check the server's log")
            rows.append({int(t): (float(v["logprob"]), int(v.get("rank") or 0)) for t, v in entry.items()})
        return PromptScores(rows, size)

    def tokenize(self, text: str, timeout: float) -> list[int] | None:
        try:
            out = http.post_json(self.url + "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}, timeout=timeout, what="vLLM")
        except ServerError:
            return None  # a server without /tokenize: the round trip is checked on the scores instead
        toks = out.get("tokens") if isinstance(out, dict) else None
        return [int(t) for t in toks] if isinstance(toks, list) else None
