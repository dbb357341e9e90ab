"""A loopback stand-in for SGLang's HTTP server, backed by a real model (transformers,
fp32, CPU): the real SGLang does not run on this machine (docs/scale.md says why), so
this answers SGLang's endpoints in SGLang's own shapes with a real target's numbers.

The shapes are read from SGLang 0.5.23's source (the PyPI release):
  python/sglang/srt/entrypoints/http_server.py      /generate, /model_info (/get_model_info),
                                                    /server_info, /v1/models, /tokenize,
                                                    _create_error_response: 400 {"error": {"message"}}
  python/sglang/srt/entrypoints/api_contract.py     a body the JSON contract rejects: 400 {"error": "..."}
  python/sglang/srt/managers/io_struct.py           GenerateReqInput's fields
  python/sglang/srt/managers/tokenizer_manager.py   meta_info; add_logprob_to_meta_info; detokenize_*:
                                                    [logprob, id, text or None] triples, None rows;
                                                    _validate_one_request's ValueErrors (context,
                                                    token_ids_logprob out of the vocabulary)
  python/sglang/srt/managers/scheduler_components/logprob_result_processor.py
                                                    the None first entry of every input_* list
  python/sglang/srt/managers/scheduler.py           logprob_start_len -1 and past the input
  python/sglang/srt/layers/logprob_processor.py     raw log_softmax; topk(top_logprobs_num) with no
                                                    guard (past the vocabulary the scheduler raises,
                                                    and its exception stops the server)
  python/sglang/srt/sampling/sampling_params.py     sampling_seed, top_k -1
  python/sglang/srt/sampling/sampling_batch_info.py sampling_seed used only under deterministic inference
  python/sglang/srt/managers/schedule_batch.py      FINISH_LENGTH / FINISH_MATCHED_TOKEN to_json
  python/sglang/srt/entrypoints/openai/protocol.py  ModelCard, TokenizeResponse, ErrorResponse
A logprob of −inf goes out as null, as orjson writes it. `sampling_seed` is honoured
always (the real server honours it under --enable-deterministic-inference).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

VERSION = "0.5.23"


def _clean(x: Any) -> Any:
    """orjson's JSON: non-finite floats are null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    return x


class Target:
    """The model behind the stand-in, one request at a time."""

    def __init__(self, path: Path, served_name: str | None = None, context_len: int = 2048) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path, self.served = str(path), served_name or str(path)
        self.tok = AutoTokenizer.from_pretrained(self.path)
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32).eval()
        self.vocab = int(self.model.config.vocab_size)
        self.context_len = context_len
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.lock = threading.Lock()
        self.top_asked: list[int] = []  # every top_logprobs_num received (a test checks what was sent)
        self.written: dict[tuple[tuple[int, ...], float, int], list[int]] = {}  # (input ids, temperature, seed) -> the tokens sampled

    def logprobs(self, ids: list[int]) -> Any:
        """[len(ids), V] log_softmax over the vocabulary at each position (fp32, raw)."""
        import torch

        with self.lock, torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    def sample(self, ids: list[int], params: dict[str, Any]) -> tuple[list[int], list[Any]]:
        """SGLang's sampling (temperature; the joint top-k/top-p/min-p mask; greedy below
        T = 1e-6), one token at a time; the tokens and each step's raw logprobs."""
        import torch

        from specprobe.models.anatomy import output_cache
        from specprobe.models.loader import cache_kwarg

        kw = cache_kwarg(self.model)
        t = float(params.get("temperature", 1.0))
        top_k = int(params.get("top_k", -1))
        top_p, min_p = float(params.get("top_p", 1.0)), float(params.get("min_p", 0.0))
        g = torch.Generator().manual_seed(_seed(params))
        out: list[int] = []
        steps = []
        with self.lock, torch.inference_mode():
            past, x = None, list(ids)
            for _ in range(int(params.get("max_new_tokens", 128))):
                o = self.model(input_ids=torch.tensor([x]), use_cache=True, **{kw: past})
                past = output_cache(o)
                logits = o.logits[0, -1].float()
                steps.append(torch.log_softmax(logits, -1))
                if t < 1e-6:
                    nxt = int(logits.argmax())
                else:
                    p = torch.softmax(logits / t, -1)
                    sp, si = p.sort(descending=True)
                    keep = torch.ones_like(sp, dtype=torch.bool)
                    if 0 < top_k < len(sp):
                        keep[top_k:] = False
                    keep &= (sp.cumsum(0) - sp) <= top_p
                    keep &= sp >= min_p * sp[0]
                    sp = torch.where(keep, sp, torch.zeros_like(sp))
                    nxt = int(si[torch.multinomial(sp / sp.sum(), 1, generator=g)])
                out.append(nxt)
                if nxt in self.eos and not params.get("ignore_eos"):
                    break
                x = [nxt]
        return out, steps


def _seed(params: dict[str, Any]) -> int:
    """SGLang's seed for a request: its sampling_seed, 42 where none is given."""
    seed = params.get("sampling_seed")
    return 42 if seed is None else int(seed)


def _triple(lp: float, t: int, text: str | None) -> list[Any]:
    return [lp, t, text]


class SglangHandler(BaseHTTPRequestHandler):
    target: ClassVar[Target]
    lora: ClassVar[list[str]] = []
    tokenize: ClassVar[bool] = True
    started: ClassVar[float] = 0.0

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(_clean(body)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        t = type(self).target
        if self.path in ("/model_info", "/get_model_info"):
            self._send(200, {"model_path": t.path, "served_model_name": t.served, "tokenizer_path": t.path, "is_generation": True,
                             "preferred_sampling_params": None, "weight_version": "default", "load_format": "auto", "reasoning_parser": None,
                             "tool_call_parser": None, "disaggregation_mode": "null", "has_image_understanding": False,
                             "has_audio_understanding": False, "model_type": "llama", "architectures": ["LlamaForCausalLM"]})
        elif self.path in ("/server_info", "/get_server_info"):
            self._send(200, {"model_path": t.path, "served_model_name": t.served, "tp_size": 1, "device": "cpu", "startup_time": type(self).started,
                             "internal_states": [{}], "version": VERSION, "frontend": "python"})
        elif self.path == "/v1/models":
            cards = [{"id": t.served, "object": "model", "created": int(type(self).started), "owned_by": "sglang", "root": t.served, "parent": None, "max_model_len": t.context_len}]
            cards += [{"id": n, "object": "model", "created": int(type(self).started), "owned_by": "sglang", "root": f"/loras/{n}", "parent": t.served, "max_model_len": None}
                      for n in type(self).lora]
            self._send(200, {"object": "list", "data": cards})
        elif self.path == "/health":
            self._send(200, {})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        try:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        except ValueError as e:
            self._send(422, {"detail": [{"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error", "input": {}, "ctx": {"error": str(e)}}]})
            return
        if self.path == "/tokenize" and type(self).tokenize:
            ids = type(self).target.tok.encode(body.get("prompt", ""), add_special_tokens=bool(body.get("add_special_tokens", True)))
            self._send(200, {"tokens": ids, "count": len(ids), "max_model_len": type(self).target.context_len})
        elif self.path == "/generate":
            self._generate(body)
        else:
            self._send(404, {"detail": "Not Found"})

    def _generate(self, body: dict[str, Any]) -> None:
        t = type(self).target
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
            where = next((i for i, x in enumerate(ids) if not isinstance(x, int)), 0) if isinstance(ids, list) else None
            msg = "Expected `array`, got `" + type(ids).__name__ + "` - at `$.input_ids`" if where is None else f"Expected `int`, got `{type(ids[where]).__name__}` - at `$.input_ids[{where}]`"
            self._send(400, {"error": msg})  # the JSON contract's refusal: a plain string
            return
        if len(ids) >= t.context_len:
            self._send(400, {"error": {"message": f"The input ({len(ids)} tokens) is longer than the model's context length ({t.context_len} tokens)."}})
            return
        params = dict(body.get("sampling_params") or {})
        want = bool(body.get("return_logprob"))
        k = int(body.get("top_logprobs_num") or 0)
        chosen = body.get("token_ids_logprob")
        text = bool(body.get("return_text_in_logprobs"))
        if chosen:
            bad = next((c for c in chosen if not 0 <= int(c) < t.vocab), None)
            if bad is not None:
                self._send(400, {"error": {"message": f"token_ids_logprob contains out-of-vocabulary token id {bad}; valid range is [0, {t.vocab})."}})
                return
        if want:
            t.top_asked.append(k)
            if k > t.vocab:  # SGLang: torch.topk raises in the scheduler, which takes the server down
                self.close_connection = True
                self.connection.shutdown(2)
                return
        start = int(body.get("logprob_start_len", -1) if body.get("logprob_start_len") is not None else -1)
        if want and start > len(ids):
            msg = f"req.logprob_start_len={start} is higher than the number of input tokens len(req.origin_input_ids)={len(ids)}. Please use a smaller logprob_start_len."
            self._send(400, {"error": {"message": msg}})
            return
        t0 = time.perf_counter()
        out, steps = t.sample(ids, params)
        t.written[(tuple(ids), float(params.get("temperature", 1.0)), _seed(params))] = out
        word = (lambda x: t.tok.decode([x])) if text else (lambda x: None)
        finish = {"type": "stop", "matched": out[-1]} if out and out[-1] in t.eos and not params.get("ignore_eos") else {"type": "length", "length": len(out)}
        meta: dict[str, Any] = {"id": f"{abs(hash((tuple(ids), t0))):032x}", "finish_reason": finish, "prompt_tokens": len(ids), "weight_version": "default",
                                "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": len(out), "cached_tokens": 0}
        if want:
            s = len(ids) if start < 0 else start
            lp = t.logprobs(ids) if s < len(ids) else None  # [N, V]
            seq = range(s, len(ids))
            meta["input_token_logprobs"] = [_triple(None if j == s else float(lp[j - 1, ids[j]]), ids[j], word(ids[j])) for j in seq]
            meta["output_token_logprobs"] = [_triple(float(st[o]), o, word(o)) for st, o in zip(steps, out, strict=True)]
            meta["output_token_logprobs_length"] = len(out)
            if k > 0:
                tops = [None if j == s else [_triple(float(v), int(i), word(int(i))) for v, i in zip(*lp[j - 1].topk(k), strict=True)] for j in seq]
                meta["input_top_logprobs"] = tops
                meta["output_top_logprobs"] = [[_triple(float(v), int(i), word(int(i))) for v, i in zip(*st.topk(k), strict=True)] for st in steps]
            if chosen is not None:
                meta["input_token_ids_logprobs"] = [None if j == s else [_triple(float(lp[j - 1, c]), int(c), word(int(c))) for c in chosen] for j in seq]
                meta["output_token_ids_logprobs"] = [[_triple(float(st[c]), int(c), word(int(c))) for c in chosen] for st in steps]
        meta["e2e_latency"] = time.perf_counter() - t0
        self._send(200, {"text": t.tok.decode(out), "output_ids": out, "meta_info": meta})


@contextmanager
def sglang_emulator(target: Target, lora: list[str] | None = None) -> Iterator[str]:
    """SglangHandler on 127.0.0.1 (a free port) in a thread, for `target`: its base URL."""
    from tests.helpers import loopback_stub

    handler = type("Handler", (SglangHandler,), {"target": target, "lora": list(lora or []), "started": time.time()})
    yield from loopback_stub(handler)
