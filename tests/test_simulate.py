"""`simulate`: the real draft→verify loop. Closed-form rejection sampling on synthetic
tensors; exactness on tiny random models (greedy output token-identical to the target's,
a chi-square test that sampled output follows the target's distribution, identical and
always-disagreeing drafters); agreement with transformers' assisted generation; the
pipeline and CLI on the tiny checkpoint family; one run on the real SmolLM2."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats
from typer.testing import CliRunner

from specprobe.metrics.sampling import Sampling, probs
from specprobe.simulate import (
    DraftRule,
    Proposal,
    SimCounters,
    SimRun,
    Stream,
    speculate,
    verify_greedy,
    verify_sampled,
)
from specprobe.simulate.loop import Batch, Settings, decode_batch
from tests.conftest import requires_smollm2

GREEDY = Sampling(temperature=0.0)


# ----------------------------------------------------------------------------- tiny models
def tiny(seed: int, vocab: int = 300, scale: float = 8.0, dtype: torch.dtype = torch.float64):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(scale / m.lm_head.weight.std())  # peaked, model-specific
    return m.to(dtype)


def noisy_copy(model, seed: int, noise: float):
    """A drafter that agrees with the target often but not always."""
    import copy

    d = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return d


class AntiDrafter(torch.nn.Module):
    """Negated logits of the target: its argmax is the target's argmin, never its argmax."""

    def __init__(self, model) -> None:
        super().__init__()
        self.inner = model

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=True, **kw):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=use_cache)
        return SimpleNamespace(logits=-out.logits, cache=out.cache)


def rand_prompts(n: int, vocab: int = 300, seed: int = 5) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 14, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lengths]


def hf_greedy(model, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False, pad_token_id=0, eos_token_id=None)
            out.append(g[0, len(p):].tolist())
    return out


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target():
    return tiny(0)


@pytest.fixture(scope="module")
def prompts():
    return rand_prompts(6)


@pytest.fixture(scope="module")
def reference(target, prompts):
    return hf_greedy(target, prompts, 24)


# ----------------------------------------------------------------------------- closed form
def test_verify_greedy_on_forced_argmax() -> None:
    v = 10
    target_tokens = torch.tensor([[3, 4, 5, 6], [3, 4, 5, 6]])  # argmax per position, K+1 = 4
    logits = torch.full((2, 4, v), -100.0).scatter_(-1, target_tokens[..., None], 100.0)
    drafts = torch.tensor([[3, 4, 9], [7, 4, 5]])
    n, nxt = verify_greedy(drafts, torch.tensor([3, 3]), logits)
    assert n.tolist() == [2, 0] and nxt.tolist() == [5, 3]  # correction = target's argmax
    n, nxt = verify_greedy(torch.tensor([[3, 4, 5]]), torch.tensor([3]), logits[:1])
    assert n.tolist() == [3] and nxt.tolist() == [6]  # bonus token
    n, _ = verify_greedy(torch.tensor([[3, 4, 5]]), torch.tensor([1]), logits[:1])
    assert n.tolist() == [1]  # a row that drafted 1 cannot accept more


def test_verify_sampled_identical_distributions_accept_everything() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 4, 20, generator=g), -1)
    drafts = torch.multinomial(p[:, :3].reshape(-1, 20), 1, generator=g).view(64, 3)
    n, _ = verify_sampled(drafts, torch.full((64,), 3), p[:, :3].clone(), p, g)
    assert n.tolist() == [3] * 64


def test_rejection_sampling_reproduces_target_distribution() -> None:
    """One draft position, many rows: the emitted token ~ p exactly (chi-square)."""
    g = torch.Generator().manual_seed(1)
    v, rows = 8, 40_000
    p1 = torch.softmax(torch.randn(v, generator=g) * 1.5, -1)
    q1 = torch.softmax(torch.randn(v, generator=g) * 1.5, -1)
    p = p1.expand(rows, 2, v).clone()
    q = q1.expand(rows, 1, v).clone()
    drafts = torch.multinomial(q[:, 0], 1, replacement=True, generator=g)
    n, nxt = verify_sampled(drafts, torch.ones(rows, dtype=torch.long), q, p, g)
    first = torch.where(n == 1, drafts[:, 0], nxt)  # the first emitted token
    counts = torch.bincount(first, minlength=v).double().numpy()
    exp = p1.double().numpy()
    assert stats.chisquare(counts, exp / exp.sum() * counts.sum()).pvalue > 1e-3
    # acceptance rate = Σ min(p, q)
    assert abs(n.double().mean().item() - torch.minimum(p1, q1).sum().item()) < 0.01


def test_counters_follow_vllm_conventions() -> None:
    """10 drafts of K = 3, two of them cut to one token at the end of a budget: the rate of
    positions proposed (÷ drafts that proposed it) and vLLM's per-position rate (÷ all
    drafts) differ at depths 2 and 3 — the two denominators must not be confused."""
    c = SimCounters(3)
    c.num_drafts, c.drafted_tokens, c.accepted_tokens, c.verify_steps = 10, 26, 12, 10
    c.emitted_tokens = 20  # two tokens were cut at an EOS: not emitted, not counted
    c.accepted_at[:] = [6, 4, 2]
    c.drafted_at[:] = [10, 8, 8]
    assert c.cumulative() == pytest.approx([0.6, 0.5, 0.25])
    assert c.cumulative_vllm() == pytest.approx([0.6, 0.4, 0.2])
    assert c.conditional() == pytest.approx([0.6, 0.5 / 0.6, 0.5])
    assert c.tau_tokens == pytest.approx(2.35)  # 1 + Σ r_i
    assert c.mean_acceptance_length == pytest.approx(2.2)  # vLLM: 1 + 12 / 10
    assert c.tokens_per_verify == pytest.approx(2.0)  # emitted ÷ verify steps
    assert c.accept_rate == pytest.approx(12 / 26)
    assert np.isnan(SimCounters(2).tau_tokens)  # nothing drafted: nan, not 1


def test_monitor_and_simulate_share_one_per_position_definition() -> None:
    """The same counts read by monitor (an engine's counters) and by simulate give the
    same vLLM per-position rate and mean acceptance length."""
    from specprobe.monitor.windows import WindowCounts, window_stats

    c = SimCounters(3)
    c.num_drafts, c.drafted_tokens, c.accepted_tokens = 10, 26, 12
    c.accepted_at[:] = [6, 4, 2]
    c.drafted_at[:] = [10, 8, 8]
    w = window_stats(WindowCounts(drafts=10, draft_tokens=26, accepted=12, accepted_per_pos=(6, 4, 2)))
    assert list(w.per_pos_cum) == pytest.approx(c.cumulative_vllm())
    assert w.mean_accept_len == pytest.approx(c.mean_acceptance_length)
    assert w.accept_rate == pytest.approx(c.accept_rate)


# ----------------------------------------------------------------------------- exactness on tiny models
@pytest.mark.parametrize("batch_size", [1, 4])
def test_greedy_output_is_token_identical(target, prompts, reference, batch_size) -> None:
    for drafter in (noisy_copy(target, 1, 0.3), tiny(7)):
        run = speculate(target, drafter, prompts, k=3, target_sampling=GREEDY, max_new_tokens=24, batch_size=batch_size)
        assert run.outputs == reference
        c = run.counters
        assert c.emitted_tokens == 24 * len(prompts)
        # one target pass verifies every row of a batch: real batching
        assert c.target_calls == c.verify_steps if batch_size == 1 else c.target_calls < c.verify_steps / 2


def test_baseline_decoding_matches_target_greedy(target, prompts, reference) -> None:
    run = speculate(target, None, prompts, k=0, target_sampling=GREEDY, max_new_tokens=24, batch_size=3)
    assert run.outputs == reference and run.counters.tau_tokens == 1.0


def test_identical_drafter_accepts_everything(target, prompts) -> None:
    for s in (GREEDY, Sampling(temperature=1.0)):
        run = speculate(target, target, prompts, k=4, target_sampling=s, max_new_tokens=21, batch_size=3, seed=3)
        c = run.counters
        assert c.accept_rate == 1.0 and c.tau_tokens == 5.0
        assert c.cumulative() == [1.0] * 4


def test_always_disagreeing_drafter_accepts_nothing(target, prompts, reference) -> None:
    run = speculate(target, AntiDrafter(target), prompts, k=3, target_sampling=GREEDY, max_new_tokens=24, batch_size=4)
    assert run.counters.accepted_tokens == 0 and run.counters.tau_tokens == 1.0
    assert run.outputs == reference


def test_eos_stops_a_row(target, prompts, reference) -> None:
    eos = reference[0][5]
    run = speculate(target, noisy_copy(target, 1, 0.3), prompts[:1], k=3, target_sampling=GREEDY, max_new_tokens=24, eos_ids=[eos])
    assert run.outputs[0] == reference[0][: reference[0].index(eos) + 1]


class Replay:
    """A model-free draft source, as an n-gram drafter is: it proposes each row's known
    continuation, q one-hot at each draft."""

    max_depth = None
    calls = 0
    seconds = 0.0

    def __init__(self, futures: list[list[int]]) -> None:
        self.futures, self.at = futures, [0] * len(futures)

    def propose(self, cap, rule, gen) -> Proposal:
        prop = Proposal.nothing(len(self.at), rule.k, cap.device)
        for r, m in enumerate(cap.tolist()):
            toks = self.futures[r][self.at[r] : self.at[r] + m]
            prop.tokens[r, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            prop.drafted[r] = len(toks)
        prop.q = [torch.nn.functional.one_hot(prop.tokens[:, j], rule.vocab).float() for j in range(rule.k)]
        return prop

    def watch(self, ids, valid, forward):
        return forward()

    def accept(self, prop, n, nxt) -> None:
        self.at = [a + m + 1 for a, m in zip(self.at, n.tolist(), strict=True)]

    def compact(self) -> None:
        pass

    def select(self, rows) -> None:
        self.futures, self.at = [self.futures[r] for r in rows.tolist()], [self.at[r] for r in rows.tolist()]


def test_the_loop_runs_any_draft_source(target, prompts, reference) -> None:
    """The loop knows a drafter only through the DraftSource protocol: a model-free source
    replaying the target's greedy output is accepted at every depth, drafting from round 1."""
    k, b = 4, len(prompts)
    s = Settings(k=k, target_sampling=GREEDY, draft=DraftRule(k=k, sampling=GREEDY, threshold=None, vocab=300), eos=frozenset(), device=torch.device("cpu"))
    run = SimRun(SimCounters(k), outputs=[[] for _ in prompts])
    batch = Batch(Stream(target, b, "cpu"), Replay(reference), list(range(b)), [list(p) for p in prompts], [24] * b, torch.Generator())
    with torch.inference_mode():
        decode_batch(batch, s, run)
    c = run.counters
    assert run.outputs == reference
    assert c.accept_rate == 1.0 and c.cumulative() == [1.0] * k
    assert c.verify_steps == 5 * b  # 24 tokens = 4 rounds of K+1, then 3 drafts + 1 (never past the budget)


def _exact_marginals(model, prompt: list[int], s: Sampling) -> tuple[np.ndarray, np.ndarray]:
    """P(first emitted token) and P(second emitted token) under the target's sampling."""
    with torch.inference_mode():
        p1 = probs(model(torch.tensor([prompt])).logits[0, -1], s).double()  # [V]
        v = p1.shape[0]
        ids = torch.cat([torch.tensor([prompt]).expand(v, -1), torch.arange(v)[:, None]], 1)
        p2_given = probs(model(ids).logits[:, -1], s).double()  # [V, V]
    return p1.numpy(), (p1[:, None] * p2_given).sum(0).numpy()


def _chi2(samples: list[int], expected_p: np.ndarray) -> float:
    counts = np.bincount(samples, minlength=len(expected_p)).astype(float)
    exp = expected_p * len(samples)
    big = exp >= 5  # pool the sparse bins so the test is valid
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    if ex[-1] == 0:
        obs, ex = obs[:-1], ex[:-1]
    return float(stats.chisquare(obs, ex * obs.sum() / ex.sum()).pvalue)


@pytest.mark.parametrize(
    ("ts", "ds"),
    [
        (Sampling(temperature=1.0), Sampling(temperature=1.0)),
        (Sampling(temperature=0.8, top_p=0.9), Sampling(temperature=1.3, top_k=12)),
    ],
)
def test_sampled_output_follows_target_distribution(ts, ds) -> None:
    """Many draws of the same prompt (one batch): the first and second emitted tokens
    follow the target's exact marginals, though the drafter's q differs."""
    v = 48
    tgt = tiny(11, vocab=v, scale=0.2)  # a spread distribution (entropy ≈ 2.5 nats)
    drafter = noisy_copy(tgt, 2, 0.3)  # α ≈ 0.6
    prompt = [3, 17, 5, 40]
    n = 3000
    run = speculate(tgt, drafter, [prompt] * n, k=2, target_sampling=ts, draft_sampling=ds, max_new_tokens=3, batch_size=n, seed=123)
    c = run.counters
    assert 0.05 < c.accept_rate < 0.95  # both branches (accept / residual) exercised
    p1, p2 = _exact_marginals(tgt, prompt, ts)
    assert _chi2([o[0] for o in run.outputs], p1) > 1e-3
    assert _chi2([o[1] for o in run.outputs], p2) > 1e-3


def test_adaptive_threshold_drafts_less(target, prompts) -> None:
    drafter = noisy_copy(target, 1, 0.3)
    s = Sampling(temperature=1.0)
    full = speculate(target, drafter, prompts, k=4, target_sampling=s, max_new_tokens=20, batch_size=3).counters
    ada = speculate(target, drafter, prompts, k=4, target_sampling=s, max_new_tokens=20, batch_size=3, threshold=0.6).counters
    assert ada.mean_k < full.mean_k
    assert ada.accept_rate >= full.accept_rate - 0.05  # it drops the unconfident guesses


# ----------------------------------------------------------------------------- peer: transformers assisted generation
def test_tau_agrees_with_transformers_assisted_generation(target, prompts) -> None:
    """Greedy, constant K: τ = generated tokens ÷ target forward calls, both ways."""
    drafter = noisy_copy(target, 1, 0.3)
    k, max_new = 3, 30
    calls = {"n": 0}
    hook = target.register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    generated = 0
    try:
        drafter.generation_config.num_assistant_tokens = k
        drafter.generation_config.num_assistant_tokens_schedule = "constant"
        drafter.generation_config.assistant_confidence_threshold = 0.0  # no early stop: plain constant K
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p])
                out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, max_new_tokens=max_new, do_sample=False, pad_token_id=0, eos_token_id=None)
                generated += out.shape[1] - len(p)
    finally:
        hook.remove()
    tau_peer = generated / calls["n"]
    run = speculate(target, drafter, prompts, k=k, target_sampling=GREEDY, max_new_tokens=max_new, batch_size=len(prompts))
    tau_ours = run.counters.tokens_per_verify
    assert 1.2 < tau_ours < k + 1  # a partly agreeing drafter: the comparison means something
    assert abs(tau_ours - tau_peer) / tau_peer < 0.02, (tau_ours, tau_peer)
    print(f"τ specprobe {tau_ours:.4f} vs assisted generation {tau_peer:.4f}")


# ----------------------------------------------------------------------------- pipeline and CLI (tiny checkpoints)
def _sim_cfg(tiny_pair, tmp_path, drafter: str, **kw):
    from specprobe.settings.pipeline import DiagnoseConfig, SimulateConfig
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl")
    d = DiagnoseConfig(target=str(tiny_pair["target"]), drafter=drafter, prompts=str(pf), max_new_tokens=12, batch_size=3, keep_positions=False, **kw)
    return SimulateConfig(d, ks=[1, 3], adaptive_threshold=0.5)


def test_run_simulate_result_schema(tiny_pair, tmp_path) -> None:
    from specprobe.settings.pipeline import SamplingFlags
    from specprobe.simulate import run_simulate

    # sampled drafts: an identical drafter's q is p, so every draft is accepted (a greedy
    # draft would be accepted with p(argmax) only)
    r = run_simulate(_sim_cfg(tiny_pair, tmp_path, "self", sampling=SamplingFlags(temperature=0.7), draft_sampling="probabilistic"))
    assert r.command == "simulate" and r.scored and not r.interrupted
    m = r.measured
    assert [row.k for row in m.k_table] == [1, 3]
    for row in m.k_table:
        assert row.accept_rate == pytest.approx(1.0) and row.tau_tokens == pytest.approx(row.k + 1)
        assert row.tau_estimate == pytest.approx(row.k + 1, rel=1e-3) and abs(row.tau_gap) < 1e-2
        assert row.tokens_per_s > 0 and row.draft_ms_per_step > 0 and row.target_ms_per_step > 0
    assert m.depth.k == 3 and m.depth.cumulative == [1.0, 1.0, 1.0] and m.depth.depth == [1, 2, 3]
    assert m.baseline_tokens_per_s > 0 and m.adaptive.threshold == 0.5
    met = r.metrics
    assert met["calibration_k"] == 3 and met["tau_gap_rel_abs"] < 0.01
    assert "SP601" not in [f.rule_id for f in r.findings]
    assert any(e.rule_id == "SP601" for e in r.evaluations)
    json.loads(r.to_json())  # plain JSON: no NaN


def test_calibration_rule_fires_on_a_gap() -> None:
    from specprobe.judge.rules import load_table

    table = load_table([])
    gap = {"tau_gap_rel_abs": 0.25, "tau_gap_z_abs": 3.1, "num_drafts_measured": 400, "tau_estimated_tokens": 2.5, "tau_measured_tokens": 2.0, "calibration_k": 4}
    found = table.findings(gap)
    assert [f.rule_id for f in found] == ["SP601"]
    assert "2.50 tokens" in found[0].message and "2 tokens" in found[0].message and "3.1 standard errors" in found[0].message
    assert not table.findings({**gap, "num_drafts_measured": 10})  # too few drafts to judge
    assert not table.findings({**gap, "tau_gap_rel_abs": 0.05})
    assert not table.findings({**gap, "tau_gap_z_abs": 1.5})  # within the noise of both sides: not a finding


def test_interrupt_keeps_what_was_measured(tiny_pair, tmp_path, monkeypatch) -> None:
    import specprobe.simulate.pipeline as sim

    real = sim.speculate
    calls = {"n": 0}

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:  # baseline, K=1 done; Ctrl-C during K=3
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(sim, "speculate", flaky)
    r = sim.run_simulate(_sim_cfg(tiny_pair, tmp_path, "self:layers=1"))
    assert r.interrupted and r.measured.interrupted
    assert [row.k for row in r.measured.k_table] == [1]


def test_cli_simulate_writes_json_and_csv(tiny_pair, tmp_path) -> None:
    from specprobe.cli.main import app
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl")
    res = CliRunner().invoke(app, [
        "simulate", str(tiny_pair["target"]), "self:layers=1", "--prompts", str(pf), "--max-new-tokens", "10", "--k", "1,2",
        "--temperature", "0", "--json", str(tmp_path / "s.json"), "--csv", str(tmp_path / "csv"), "--fail-on", "never",
    ])
    assert res.exit_code == 0, res.output
    assert "measured by real speculative decoding" in res.output
    r = json.loads((tmp_path / "s.json").read_text())
    assert r["command"] == "simulate" and r["measured"]["k_table"]
    assert (tmp_path / "csv" / "k_table.csv").is_file() and (tmp_path / "csv" / "depth.csv").is_file()
    assert "measured_tau_tokens" in (tmp_path / "csv" / "k_table.csv").read_text()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--k", "0,2"], "between 1 and 32"),
        (["--k", "two"], "comma-separated"),
        (["--adaptive-threshold", "1.5"], "outside [0, 1]"),
        (["--batch-size", "0"], "at least 1"),
        (["--temperature", "-1"], "negative"),
    ],
)
def test_cli_bad_input_exit_2_and_nothing_written(tiny_pair, tmp_path, args, needle) -> None:
    from specprobe.cli.main import app

    out = tmp_path / "s.json"
    res = CliRunner().invoke(app, ["simulate", str(tiny_pair["target"]), "self", "--json", str(out), *args])
    assert res.exit_code == 2, res.output
    assert needle in " ".join(res.output.split()) and not out.exists()


def test_cli_json_path_is_a_folder(tiny_pair, tmp_path) -> None:
    from specprobe.cli.main import app

    res = CliRunner().invoke(app, ["simulate", str(tiny_pair["target"]), "self", "--json", str(tmp_path)])
    assert res.exit_code == 2 and "is a folder" in res.output


# ----------------------------------------------------------------------------- the real model
@pytest.mark.slow
@requires_smollm2
def test_simulate_smollm2_layer_skip_greedy_matches_target() -> None:
    from specprobe.models.drafters import build_drafter
    from specprobe.models.loader import load_model

    tm = load_model("smollm2", "cpu", "float32")
    drafter = build_drafter("self:layers=24", tm)
    text = ["The capital of France is", "def fibonacci(n):"]
    enc = [tm.tokenizer(t)["input_ids"] for t in text]
    ref = hf_greedy(tm.model, enc, 12)
    run = speculate(tm.model, drafter.step_model(), enc, k=3, target_sampling=GREEDY, max_new_tokens=12, batch_size=2)
    assert run.outputs == ref
    assert 0.0 < run.counters.accept_rate < 1.0


def test_no_cache_generates_the_references_once(tiny_pair, tmp_path, monkeypatch) -> None:
    """simulate measures on the references its estimate (diagnose) made: with --no-cache
    they are generated once, not again for the measurement."""
    import specprobe.probe.references as references
    from specprobe.simulate import run_simulate

    real = references.generate_references
    calls: list[int] = []

    def counting(*a, **kw):
        calls.append(len(a[1]))
        return real(*a, **kw)

    monkeypatch.setattr(references, "generate_references", counting)
    r = run_simulate(_sim_cfg(tiny_pair, tmp_path, "self:layers=1", use_cache=False))  # --no-cache
    assert r.measured is not None and not r.interrupted
    assert calls == [6]  # one call for the six single-turn prompts
