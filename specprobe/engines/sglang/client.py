"""SGLang's HTTP server (`python -m sglang.launch_server`, `sglang serve`) as a live
server: its model (`/v1/models`, `/model_info` — `/get_model_info` on older releases),
release (`/server_info` or `/get_server_info`: `version`), `/tokenize`, and `/generate`
on token ids (`input_ids`, so the server sees exactly the ids specprobe scored).

Scoring is `/generate` with `return_logprob: true`, `logprob_start_len: 0`,
`top_logprobs_num: n` and, where asked, `token_ids_logprob: [ids]`. SGLang answers in
`meta_info`, one entry per input token (the first is None: nothing predicts it):

    input_token_logprobs      [[logprob, token id, text or null], ...]   (logprob null first)
    input_top_logprobs        [null, [[logprob, id, text], ...] (n, descending), ...]
    input_token_ids_logprobs  [null, [[logprob, id, text], ...] (the ids asked, in order), ...]

`text` is null unless `return_text_in_logprobs` is set (never asked here); a logprob of
−inf travels as null (orjson writes no Infinity). The logprobs are the raw distribution
(`log_softmax` of the logits, no temperature), as vLLM's default prompt logprobs are.
The ids asked in `token_ids_logprob` are the same at every position, so the drafter's
argmax over the whole reference, asked once, is scored at every position.

What SGLang does not guard: a `top_logprobs_num` above the vocabulary reaches
`torch.topk` in the scheduler, whose exception stops the whole server; -1 (vLLM's
"every token") asks for no top logprobs at all. Both are refused here before sending.

Its /metrics has no cumulative accepted-token counter (only the gauges
`sglang:spec_accept_length`, `sglang:spec_accept_rate` and the counter
`sglang:spec_verify_calls_total`): `--against` cannot read a delta from it.

Errors, as its code writes them: a request the JSON contract rejects, HTTP 400
`{"error": "..."}`; a ValueError from the tokenizer manager (a prompt past the context,
an id out of the vocabulary), HTTP 400 `{"error": {"message": "..."}}`; a body FastAPI
cannot parse, HTTP 422 `{"detail": [...]}`; `/tokenize`'s, `{"object": "error",
"message": ...}`. The shared HTTP client reads each of them into its one-line error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specprobe.core.errors import ConfigError, ServerError
from specprobe.engines import http  # the engines' shared HTTP client
from specprobe.engines.base import Engine, LiveServer, PromptScores, SpecCounters

WHAT = "SGLang"


def _first_json(url: str, paths: Sequence[str], timeout: float) -> dict[str, Any]:
    """The first of `paths` the server answers with a JSON object ({} when none does)."""
    for p in paths:
        try:
            got = http.get_json(url + p, timeout=timeout, what=WHAT)
        except ServerError:
            continue
        if isinstance(got, dict):
            return got
    return {}


def _logprob(v: Any) -> float:
    return float("-inf") if v is None else float(v)


def rows_from_meta(meta: Mapping[str, Any], ids: Sequence[int], n: int, chosen: Sequence[int] = ()) -> list[dict[int, tuple[float, int]]]:
    """SGLang's `meta_info` for `ids` scored from position 0 -> PromptScores rows: per
    position after the first, {token id: (logprob, rank)} with the top-n at ranks 1..n
    (in the order SGLang lists them, descending), the actual token and the chosen ids at
    rank n + 1 where they are not among the top-n (SGLang gives no rank for them)."""
    tokens = meta.get("input_token_logprobs")
    tops = meta.get("input_top_logprobs")
    picked = meta.get("input_token_ids_logprobs") if chosen else None
    if not isinstance(tokens, list) or (n > 0 and not isinstance(tops, list)) or (chosen and not isinstance(picked, list)):
        missing = [k for k, v in (("input_token_logprobs", tokens), ("input_top_logprobs", tops if n > 0 else []), ("input_token_ids_logprobs", picked if chosen else [])) if not isinstance(v, list)]
        raise ServerError(f"SGLang answered without {', '.join(missing)} in meta_info", "check that the server is SGLang's own HTTP server (/generate with return_logprob)")
    for name, got in (("input_token_logprobs", tokens), ("input_top_logprobs", tops), ("input_token_ids_logprobs", picked)):
        if isinstance(got, list) and len(got) != len(ids):
            raise ServerError(f"SGLang scored {len(got)} prompt positions of the {len(ids)} sent ({name})",
                              "check the server's log: a prompt past its context, or --allow-auto-truncate cutting it")
    rows: list[dict[int, tuple[float, int]]] = []
    beyond = max(n, 0) + 1
    for j in range(1, len(ids)):
        row: dict[int, tuple[float, int]] = {}
        top = tops[j] if isinstance(tops, list) else None
        for r, entry in enumerate(top or [], start=1):
            t = int(entry[1])
            if t not in row:
                row[t] = (_logprob(entry[0]), r)
        entry = tokens[j]
        sent, back = int(ids[j]), int(entry[1])
        if back != sent and back != 0:  # SGLang writes 0 for ids at or past vocab_size − 1
            raise ServerError(f"SGLang scored token {back} at position {j} where {sent} was sent",
                              "the server re-tokenised the prompt: check that /generate gets input_ids")
        row.setdefault(sent, (_logprob(entry[0]), beyond))
        if picked is not None:
            for e in picked[j] or []:
                row.setdefault(int(e[1]), (_logprob(e[0]), beyond))
        rows.append(row)
    return rows


class SglangServer(LiveServer):
    scores_chosen = True
    lists_every_token = False  # top_logprobs_num is a count: -1 lists nothing

    def __init__(self, engine: Engine, url: str, model: str | None, timeout: float) -> None:
        self.engine, self.url, self.timeout = engine, url.rstrip("/"), timeout
        self.model, card = http.served_model(self.url, model, timeout=timeout, what=WHAT)
        # a LoRA adapter is listed with its base model as `parent`: /generate names it in lora_path
        self.lora = self.model if card.get("parent") else None
        info = _first_json(self.url, ("/model_info", "/get_model_info"), timeout)
        if info.get("is_generation") is False:
            raise ConfigError(f"the server at {self.url} serves {self.model!r} as an embedding model", "point --target-server at a server that generates (without --is-embedding)")
        # where its tokenizer came from (its /v1/models `root` is only the served name)
        self.tokenizer_name = str(info.get("tokenizer_path") or info.get("model_path") or "") or None
        got = _first_json(self.url, ("/server_info", "/get_server_info"), timeout)
        self.version = str(got["version"]) if got.get("version") else None

    def counters(self) -> SpecCounters:
        raise ConfigError(f"SGLang's /metrics at {self.url} has no cumulative accepted-token counter (only the gauges sglang:spec_accept_length and sglang:spec_accept_rate)",
                          "compare with 'specprobe monitor' on its /metrics, or serve with vLLM for --against")

    def _generate(self, body: dict[str, Any], timeout: float) -> tuple[dict[str, Any], int]:
        if self.lora:
            body["lora_path"] = self.lora
        out, size = http.post_json_sized(self.url + "/generate", body, timeout=timeout, what=WHAT)
        if not isinstance(out, dict):  # a list answers a batch: one request never gets one
            raise ServerError(f"SGLang at {self.url} answered /generate with {type(out).__name__} ({str(out)[:120]})", "check that the URL is SGLang's own HTTP server")
        return out, size

    def complete(self, prompt: Sequence[int], max_tokens: int, sampling: Mapping[str, float], seed: int, timeout: float) -> list[int]:
        """`/generate` on the ids; `sampling_seed` is honoured by servers started with
        --enable-deterministic-inference (others sample unseeded)."""
        params: dict[str, Any] = {
            "max_new_tokens": int(max_tokens),
            "temperature": float(sampling.get("temperature", 1.0)),
            "top_p": float(sampling.get("top_p", 1.0)),
            "top_k": int(sampling.get("top_k", 0)) or -1,  # SGLang: -1 is the whole vocabulary
            "min_p": float(sampling.get("min_p", 0.0)),
            "sampling_seed": int(seed),
        }
        out, _ = self._generate({"input_ids": [int(t) for t in prompt], "sampling_params": params, "stream": False}, timeout)
        got = out.get("output_ids")
        if not isinstance(got, list):
            raise ServerError(f"SGLang at {self.url} answered a generation without output_ids ({str(out)[:120]})", "check the server's log")
        return [int(t) for t in got]

    def _score(self, ids: Sequence[int], n: int, chosen: Sequence[int], timeout: float) -> PromptScores:
        if n < 1:
            raise ConfigError(f"SGLang lists no top logprobs for --target-logprobs {n} (its top_logprobs_num is a count: no 'every token' setting)",
                              "give --target-logprobs N ≥ 1 (greedy drafting is exact at any N: SGLang scores the drafter's own tokens)")
        body: dict[str, Any] = {
            "input_ids": [int(t) for t in ids],
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": int(n),
            "return_text_in_logprobs": False,
            "stream": False,
        }
        if chosen:
            body["token_ids_logprob"] = [int(t) for t in chosen]
        out, size = self._generate(body, timeout)
        meta = out.get("meta_info")
        if not isinstance(meta, dict):
            raise ServerError(f"SGLang at {self.url} answered without meta_info ({str(out)[:120]})", "check that the server is SGLang's own HTTP server")
        return PromptScores(rows_from_meta(meta, ids, n, chosen), size)

    def prompt_logprobs(self, ids: Sequence[int], n: int, timeout: float) -> PromptScores:
        """`/generate` with the ids, `max_new_tokens: 1`, `return_logprob`,
        `logprob_start_len: 0` and `top_logprobs_num: n`."""
        return self._score(ids, n, (), timeout)

    def prompt_logprobs_chosen(self, ids: Sequence[int], n: int, chosen: Sequence[int], timeout: float) -> PromptScores:
        """prompt_logprobs with `token_ids_logprob: chosen` (the same ids at every position)."""
        return self._score(ids, n, chosen, timeout)

    def tokenize(self, text: str, timeout: float) -> list[int] | None:
        try:
            out = http.post_json(self.url + "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}, timeout=timeout, what=WHAT)
        except ServerError:
            return None  # an older server without /tokenize: the ids are checked on the scores instead
        toks = out.get("tokens") if isinstance(out, dict) else None
        return [int(t) for t in toks] if isinstance(toks, list) else None
