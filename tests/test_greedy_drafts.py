"""The acceptance of one draft token under the engine's procedure, in closed form.

Greedy drafting (vLLM's default, llama.cpp, SGLang, TensorRT-LLM): the draft is the
drafter's argmax (the lowest id on ties, as torch.argmax), accepted with p_t(draft), p the
target's distribution after its sampling transform. Probabilistic drafting: Σ min(p, q).
Every scorer (the eager reference, the torch blocks, the compiled rows, the fused formula,
a head's own path) gives p(argmax q) exactly against a float64 computation; at T = 0 it is
greedy agreement. llama.cpp's sampler chain truncates before the temperature."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specprobe.estimates import estimate
from specprobe.metrics import core
from specprobe.metrics.accumulate import FIELDS, THRESHOLDS, Accumulator
from specprobe.metrics.sampling import Sampling, probs, truncate_


def _hand() -> tuple[torch.Tensor, torch.Tensor]:
    """Four positions over 5 ids, written out: the drafter's argmax is id 1, id 3 (a tie
    of ids 3 and 4: the lower wins), id 0 (a three-way tie) and id 2."""
    tl = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 0.0, 1.0, 2.0, 2.0], [1.0, 3.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    dl = torch.tensor([[0.0, 3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0, 5.0], [1.0, 1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 9.0, 0.0, 0.0]])
    return tl, dl


DRAFT_IDS = [1, 3, 0, 2]


def _p64(tl: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The target's sampling distribution in float64: one-hot at the argmax when greedy."""
    if s.greedy:
        return torch.nn.functional.one_hot(tl.argmax(-1), tl.shape[-1]).double()
    return truncate_(torch.softmax(tl.double() / s.temperature, -1), s)


def _want(tl: torch.Tensor, ts: Sampling) -> torch.Tensor:
    """p_t(argmax q) in float64: the target's own sampling distribution at the draft."""
    return _p64(tl, ts)[torch.arange(tl.shape[0]), torch.tensor(DRAFT_IDS)]


def _scorers(tl: torch.Tensor, dl: torch.Tensor, ts: Sampling, ds: Sampling, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    out = {"reference": core.position_metrics_reference(tl, dl, ts, ds).accept_prob_greedy_draft}
    out["default"] = core.position_metrics(tl, dl, ts, ds, top=2).accept_prob_greedy_draft  # the compiled rows where they take it
    with monkeypatch.context() as m:
        m.setenv("SPECPROBE_SCORER", "torch")
        out["blocks"] = core.position_metrics(tl, dl, ts, ds).accept_prob_greedy_draft
    if not ts.truncates and not ds.truncates:
        fused = core._fused_body(tl, dl, 1.0 if ts.greedy else ts.temperature, 1.0 if ds.greedy else ds.temperature, ts.greedy, ds.greedy, 0)
        out["fused"] = fused[-1]
    return out


@pytest.mark.parametrize("ts,ds", [
    (Sampling(0.7), Sampling(0.7)),
    (Sampling(1.0), Sampling(1.6)),  # the drafter's own temperature does not move its argmax
    (Sampling(1.3), Sampling(0.0)),
    (Sampling(0.8, top_p=0.6), Sampling(0.8, top_p=0.6)),  # p after the target's truncation
    (Sampling(0.9, top_k=2, semantics="sglang"), Sampling(0.9)),
])
def test_a_greedy_draft_is_accepted_with_the_targets_probability_of_it(ts: Sampling, ds: Sampling, monkeypatch: pytest.MonkeyPatch) -> None:
    tl, dl = _hand()
    want = _want(tl, ts)
    for name, got in _scorers(tl, dl, ts, ds, monkeypatch).items():
        torch.testing.assert_close(got.double(), want, atol=2e-7, rtol=0, msg=name)
    # the hand numbers: at T = 1 the first row's draft (id 1) has e¹ / (e² + e¹ + e^0.5 + e⁰ + e⁻¹)
    if ts == Sampling(1.0):
        e = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0], dtype=torch.float64).exp()
        assert float(want[0]) == pytest.approx(float(e[1] / e.sum()), abs=1e-12)


def test_ties_among_the_drafters_top_logits_draft_the_lowest_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 1's drafter ties ids 3 and 4 (the target's top two, equal too): the draft is id
    3, accepted with p(3) — not p(3) + p(4), nor the mean of the two."""
    tl, dl = _hand()
    s = Sampling(1.0)
    p = torch.softmax(tl[1].double(), -1)
    for name, got in _scorers(tl, dl, s, s, monkeypatch).items():
        assert float(got[1]) == pytest.approx(float(p[3]), abs=2e-7), name
        assert float(got[2]) == pytest.approx(float(torch.softmax(tl[2].double(), -1)[0]), abs=2e-7), name  # three-way tie: id 0


def test_at_temperature_zero_the_acceptance_is_greedy_agreement(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(5)
    tl = torch.randn(40, 300, generator=g).round()  # many ties at the top
    dl = tl + torch.randn(40, 300, generator=g).round()
    s = Sampling(0.0)
    for name, got in _scorers(tl, dl, s, s, monkeypatch).items():
        want = (tl.argmax(-1) == dl.argmax(-1)).float()
        assert torch.equal(got, want), name
        assert torch.equal(core.position_metrics_reference(tl, dl, s, s).greedy_agree, want)
    # and with the drafter sampling at T > 0: still the argmax draft, still agreement
    got = core.position_metrics_reference(tl, dl, s, Sampling(0.9)).accept_prob_greedy_draft
    assert torch.equal(got, (tl.argmax(-1) == dl.argmax(-1)).float())


def test_sampled_and_greedy_drafts_differ_at_temperature_above_zero() -> None:
    """Σ min(p, q) against p(argmax q) on a drafter that knows the target exactly: the
    first is 1, the second the target's top probability."""
    tl, _ = _hand()
    s = Sampling(0.7)
    pm = core.position_metrics_reference(tl, tl.clone(), s, s)
    assert torch.allclose(pm.accept_prob, torch.ones(4), atol=1e-6)
    torch.testing.assert_close(pm.accept_prob_greedy_draft.double(), _p64(tl, s).amax(-1), atol=2e-7, rtol=0)
    assert bool((pm.accept_prob_greedy_draft < pm.accept_prob - 0.05).all())


@pytest.mark.parametrize("v,rows", [(512, 23), (49_152, 3)])  # 16 segments; SmolLM2's width
def test_every_scorer_equals_a_float64_reference_on_random_logits(v: int, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(v)
    tl = torch.randn(rows, v, generator=g) * 3
    dl = tl + torch.randn(rows, v, generator=g)
    for ts, ds in ((Sampling(0.7), Sampling(0.7)), (Sampling(1.2), Sampling(0.5)), (Sampling(0.8, top_k=50, min_p=0.02), Sampling(0.8))):
        want = _p64(tl, ts).gather(-1, dl.argmax(-1, keepdim=True)).squeeze(-1)
        for name, got in _scorers(tl, dl, ts, ds, monkeypatch).items():
            torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5, msg=f"{name} {ts.describe()}")


# ----------------------------------------------------------------------------- llama.cpp's chain
def _tempered(u: list[float], t: float) -> torch.Tensor:
    x = torch.tensor([u], dtype=torch.float64).log() / t
    return torch.softmax(x, -1)


def test_llama_cpp_truncates_the_untempered_distribution() -> None:
    """Untempered [.64, .2, .16] at T = 2: top-p .5 keeps one token in llama.cpp (.64 ≥ .5)
    and two in vLLM (tempered first: [.49, .27, .24]); min-p .3 (cut .192) drops .16 in
    llama.cpp and nothing in vLLM (cut .146 on the tempered)."""
    p = _tempered([0.64, 0.2, 0.16], 2.0)
    cut = lambda sem, **kw: truncate_(p.clone(), Sampling(2.0, semantics=sem, **kw))  # noqa: E731
    assert torch.equal(cut("llama.cpp", top_p=0.5), torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
    assert int((cut("vllm", top_p=0.5) > 0).sum()) == 2
    kept = cut("llama.cpp", min_p=0.3)
    torch.testing.assert_close(kept, torch.cat([p[:, :2] / p[:, :2].sum(), torch.zeros(1, 1, dtype=torch.float64)], -1))
    assert int((cut("vllm", min_p=0.3) > 0).sum()) == 3


def test_llama_cpp_top_p_keeps_the_token_that_crosses_and_renormalises_after_top_k() -> None:
    # at T = 1: top-k 3 leaves [.4, .3, .2] → [.444, .333, .222]; top-p .7 is reached at the
    # second (.778 ≥ .7): two tokens. Without top-k the first two make exactly .7: two.
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    out = truncate_(p.clone(), Sampling(1.0, top_k=3, top_p=0.7, semantics="llama.cpp"))
    torch.testing.assert_close(out, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]], dtype=torch.float64))
    out = truncate_(p.clone(), Sampling(1.0, top_p=0.65, semantics="llama.cpp"))
    assert int((out > 0).sum()) == 2


def test_llama_cpp_top_k_keeps_exactly_k_and_greedy_only_at_zero() -> None:
    p = torch.tensor([[0.4, 0.2, 0.2, 0.2]])
    out = truncate_(p.clone(), Sampling(1.0, top_k=2, semantics="llama.cpp"))
    assert out[0].tolist() == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])  # a tie with the 2nd is cut, the lower id kept
    assert Sampling(0.0, semantics="llama.cpp").greedy and not Sampling(1e-7, semantics="llama.cpp").greedy


def test_the_llama_cpp_engine_applies_its_own_transform() -> None:
    from specprobe.engines import SEMANTICS, get

    assert get("llama.cpp").sampling.name == "llama.cpp" and "llama.cpp" in SEMANTICS
    assert get("llama.cpp").adaptive_knob == "--spec-draft-p-min" and get("vllm").adaptive_knob is None
    g = torch.Generator().manual_seed(2)
    tl = torch.randn(16, 80, generator=g) * 2
    ts = Sampling(1.5, top_k=20, top_p=0.8, min_p=0.05, semantics="llama.cpp")
    pm = core.position_metrics(tl, tl + 0.3 * torch.randn(16, 80, generator=g), ts, ts)
    untempered = truncate_(torch.softmax(tl.double(), -1), Sampling(1.0, top_k=20, top_p=0.8, min_p=0.05, semantics="llama.cpp")) > 0
    assert torch.equal(probs(tl, ts) > 0, untempered)  # the same survivors as at T = 1: only their weights temper
    assert bool((pm.accept_prob_greedy_draft <= probs(tl, ts).amax(-1) + 1e-6).all())


# ----------------------------------------------------------------------------- the estimates
def _acc(drafting: str, alpha: list[float], greedy: list[float], k_max: int = 3, **kw: object) -> Accumulator:

    acc = Accumulator(k_max=k_max, drafting=drafting)
    n = len(alpha)
    vals = {f: np.full(n, 0.5) for f in FIELDS}
    vals["accept_prob"], vals["accept_prob_greedy_draft"] = np.asarray(alpha), np.asarray(greedy)
    acc.add_sequence("chat", np.arange(n), vals, **kw)
    return acc


def test_depth_curves_and_tau_follow_the_drafting_from_hand_sequences() -> None:
    """α = [1, .5, .2, 1] and p(argmax q) = [.8, .4, .5, .9] along one reference: the
    greedy depth curve is r_1 = mean(.8, .4, .5, .9), r_2 = mean(.8·.4, .4·.5, .5·.9), the
    probabilistic one the same of α; τ(K) = 1 + Σ r_j either way, and the renewal τ(1) =
    1 + accepted ÷ drafted over rounds that start where the last one ended."""
    a, g = [1.0, 0.5, 0.2, 1.0], [0.8, 0.4, 0.5, 0.9]
    greedy, sampled = _acc("greedy", a, g), _acc("probabilistic", a, g)
    r = greedy.cumulative_depth()
    assert r[0] == pytest.approx(0.65) and r[1] == pytest.approx((0.32 + 0.2 + 0.45) / 3) and r[2] == pytest.approx((0.8 * 0.4 * 0.5 + 0.4 * 0.5 * 0.9) / 2)
    s = sampled.cumulative_depth()
    assert s[0] == pytest.approx(0.675) and s[1] == pytest.approx((0.5 + 0.1 + 0.2) / 3)
    assert estimate.tau(r.tolist(), 2) == pytest.approx(1 + r[0] + r[1])
    # renewal at K = 1 on 4 tokens: a round at t drafts 1 token (t ≤ 2) and emits 2 if accepted
    # (prob g_t), else 1; the last token always comes from the target
    c = estimate.renewal_counts(np.asarray([g] * 3))
    assert greedy.renewal_tau()[0] == pytest.approx(estimate.renewal_tau(c.accepted, c.drafted)[0])
    start = {0: 1.0}
    for t in range(3):  # by hand: π(t+1) += π(t)(1 − g_t), π(t+2) += π(t) g_t
        pi = start.get(t, 0.0)
        start[t + 1] = start.get(t + 1, 0.0) + pi * (1 - g[t])
        start[t + 2] = start.get(t + 2, 0.0) + pi * g[t]
    drafted = sum(start.get(t, 0.0) for t in range(3))
    accepted = sum(start.get(t, 0.0) * g[t] for t in range(3))
    assert greedy.renewal_tau()[0] == pytest.approx(1 + accepted / drafted)
    # the summaries: α stays Σ min(p, q); the procedure's mean is the drafting's
    assert greedy.summary()["accept_prob_mean"] == pytest.approx(0.675) and greedy.summary()["accept_prob_engine_mean"] == pytest.approx(0.65)
    assert sampled.summary()["accept_prob_engine_mean"] == pytest.approx(0.675)


def test_greedy_adaptive_k_and_heads_read_the_greedy_acceptance() -> None:

    n = 30
    greedy = _acc("greedy", [0.9] * n, [0.6] * n, k_max=4)
    theta0 = greedy.adaptive[0]
    assert theta0[0] / theta0[3] == pytest.approx(sum(0.6**j for j in range(1, 5)))  # threshold 0: all 4 drafted, r_j = .6^j
    assert greedy.adaptive[THRESHOLDS.index(0.55)][2] == 0  # confidence .5 < .55: nothing drafted
    # a head's deeper depths: the greedy acceptance per depth, not Σ min(p, q)
    deep = {d: np.full(n, 0.3) for d in (2, 3, 4)}
    head = _acc("greedy", [0.9] * n, [0.6] * n, k_max=4, alpha_by_depth={d: np.full(n, 0.95) for d in (2, 3, 4)}, greedy_by_depth=deep)
    assert head.cumulative_depth()[1] == pytest.approx(0.6 * 0.3)
    with pytest.raises(ValueError, match="greedy_by_depth"):
        _acc("greedy", [0.9] * n, [0.6] * n, k_max=4, alpha_by_depth={d: np.full(n, 0.95) for d in (2, 3, 4)})


def test_accumulators_of_one_drafting_merge_and_keep_it() -> None:
    a, b = _acc("greedy", [0.5, 0.7, 0.9], [0.4, 0.6, 0.8]), _acc("greedy", [0.2, 0.3], [0.1, 0.2])
    merged = Accumulator.from_state(a.to_state()).merge(b)
    assert merged.drafting == "greedy" and merged.summary()["accept_prob_engine_mean"] == pytest.approx(2.1 / 5)
    with pytest.raises(ValueError, match="drafting"):
        merged.merge(_acc("probabilistic", [0.5], [0.5]))
    with pytest.raises(ValueError, match="drafting"):
        Accumulator(drafting="sampled")


# ----------------------------------------------------------------------------- results
def test_a_schema_2_result_loads_labelled_probabilistic(tmp_path) -> None:
    """A v2 file (written before the procedure was followed: its τ came from Σ min(p, q))
    opens as probabilistic drafting, its procedure's mean its accept_prob_mean."""
    import json
    from pathlib import Path

    from specprobe.report.load import load_result

    raw = json.loads((Path(__file__).parent / "data" / "results" / "v1" / "diagnose.json").read_text())
    raw = {k: v for k, v in raw.items() if k != "best_k"}
    raw["schema_version"] = 2
    raw["config"] = {**raw["config"], "engine": "vllm", "draft_sampling": "greedy"}  # what a v2 file of the last v2 code recorded
    (tmp_path / "v2.json").write_text(json.dumps(raw))
    r = load_result(tmp_path / "v2.json")
    assert r.schema_version == 3 and r.procedure is not None
    assert r.procedure.drafting == "probabilistic" and r.procedure.acceptance == "Σ min(p, q)" and r.procedure.engine is None
    assert r.metrics["accept_prob_engine_mean"] == raw["metrics"]["accept_prob_mean"]
    assert [row.tau_tokens for row in r.k_table] == [row["tau_tokens"] for row in raw["k_table"]]


def test_the_procedure_section_says_what_the_numbers_follow() -> None:
    from specprobe.probe.assemble import procedure_section

    v = procedure_section("vllm", "greedy")
    assert v["description"] == "as vLLM verifies it: greedy drafts, acceptance = p_target(draft token)" and v["adaptive_knob"] is None
    assert procedure_section("llama.cpp", "greedy")["adaptive_knob"] == "--spec-draft-p-min"
    t = procedure_section("transformers", "probabilistic")
    assert t["acceptance"] == "Σ min(p, q)" and t["adaptive_knob"] is None


# ----------------------------------------------------------------------------- a real run
def test_a_tiny_diagnose_follows_greedy_drafts_and_probabilistic_keeps_the_old_numbers(tiny_pair, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default (vLLM, greedy drafts) at T = 1: every position's acceptance is p_t(argmax
    q) ≤ max p_t, its mean differs from Σ min(p, q), and τ is built from it.
    --draft-sampling probabilistic gives τ from Σ min(p, q), as before greedy drafts
    existed: the depth curve rebuilt from the per-position α alone."""
    from specprobe.metrics.sampling import probs as sampling_probs
    from specprobe.probe import scoring
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    seen: list[tuple[np.ndarray, np.ndarray]] = []
    real = scoring.score_chunk

    def spy(tl, drafts, token_pos, sampling, *a, **kw):  # type: ignore[no-untyped-def]
        out = real(tl, drafts, token_pos, sampling, *a, **kw)
        seen.append((out.values["accept_prob_greedy_draft"], sampling_probs(tl, sampling.target).amax(-1).numpy()))
        return out

    monkeypatch.setattr(scoring, "score_chunk", spy)
    pf = prompts_file(tmp_path / "p.jsonl", n=4)
    base = dict(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(pf), max_new_tokens=10, batch_size=4, k_max=3, cost_ratio=0.1, verify_factor=1.0, sampling=SamplingFlags(temperature=1.0))
    greedy = run_diagnose(DiagnoseConfig(**base))  # type: ignore[arg-type]
    assert greedy.procedure is not None and greedy.procedure.drafting == "greedy" and greedy.config.model_dump().get("draft_sampling") == "greedy"
    got, top = np.concatenate([g for g, _ in seen]), np.concatenate([t for _, t in seen])
    assert len(got) == greedy.metrics["num_positions"] and bool((got <= top + 1e-6).all())
    m = greedy.metrics
    assert m["accept_prob_engine_mean"] == pytest.approx(float(got.mean()), abs=1e-6) and abs(m["accept_prob_engine_mean"] - m["accept_prob_mean"]) > 1e-4
    assert greedy.depth is not None and greedy.depth.cumulative[0] == pytest.approx(m["accept_prob_engine_mean"])

    sampled = run_diagnose(DiagnoseConfig(**base, draft_sampling="probabilistic"))  # type: ignore[arg-type]
    assert sampled.procedure is not None and sampled.procedure.acceptance == "Σ min(p, q)"
    assert sampled.metrics["accept_prob_mean"] == m["accept_prob_mean"] and sampled.metrics["accept_prob_engine_mean"] == sampled.metrics["accept_prob_mean"]
    pos = sampled.positions
    assert pos is not None
    acc = Accumulator(k_max=3)
    for pid in dict.fromkeys(pos.prompt_id):
        rows = [i for i, p in enumerate(pos.prompt_id) if p == pid]
        vals = {f: np.asarray([getattr(pos, f)[i] for i in rows], dtype=float) for f in FIELDS}
        acc.add_sequence(pos.domain[rows[0]], np.asarray([pos.position[i] for i in rows]), vals)
    assert sampled.depth is not None and sampled.depth.cumulative == pytest.approx(acc.cumulative_depth().tolist(), abs=1e-6)  # rows are rounded to 6 digits
    assert [r.tau_renewal_tokens for r in sampled.k_table] == pytest.approx(acc.renewal_tau().tolist(), abs=1e-5)
    assert greedy.depth.cumulative != pytest.approx(sampled.depth.cumulative, abs=1e-4)


# ----------------------------------------------------------------------------- the headline
def test_every_report_heads_with_the_procedure_and_names_alpha_the_alignment_measure(real_results) -> None:
    from io import StringIO
    from pathlib import Path

    from specprobe.report import terminal
    from specprobe.report.console import demo_table, render, render_summary
    from specprobe.report.html import render_html
    from specprobe.report.load import load_result
    from specprobe.report.markdown import render_markdown

    r = real_results.skip  # the default: vLLM, greedy drafts
    m = r.metrics
    # timed costs: the timing may not tell K apart from a neighbour (SP312), and the headline says so
    words = r.best_k_equivalent_words()
    head = f"τ {m['tau_tokens']:.2f} at K={m['best_k']}{f' ({words})' if words else ''} — as vLLM verifies it: greedy drafts, acceptance = p_target(draft token)"
    alpha = f"alignment α = Σ min(p, q) {100 * m['accept_prob_mean']:.1f}%"

    def text(fn, *a) -> str:  # type: ignore[no-untyped-def]
        buf = StringIO()
        fn(*a, terminal.console(file=buf, width=200))
        return " ".join(buf.getvalue().split())

    for shown in (text(render, r), text(render_summary, r), render_markdown(r), render_html(r)):
        assert head in shown and alpha in shown
    buf = StringIO()
    terminal.console(file=buf, width=200).print(demo_table([("self-draft", r), ("itself", real_results.twin)]))
    demo = " ".join(buf.getvalue().split())
    assert "alignment α" in demo and "as vLLM verifies it: greedy drafts" in demo and f"{100 * m['accept_prob_engine_mean']:.1f}%" in demo
    # a result saved before the procedure was followed says what its numbers were
    old = load_result(Path(__file__).parent / "data" / "results" / "v1" / "diagnose.json")
    assert "sampled drafts, acceptance = Σ min(p, q)" in text(render, old)


def test_llama_cpp_adaptive_k_reads_as_its_own_knob() -> None:
    from types import SimpleNamespace

    from specprobe.probe.assemble import procedure_section
    from specprobe.report.fmt import adaptive_wording
    from specprobe.result import Procedure

    llama = SimpleNamespace(procedure=Procedure.model_validate(procedure_section("llama.cpp", "greedy")))
    assert adaptive_wording(llama, 0.65).startswith("--spec-draft-p-min 0.65 (stop drafting before the first draft")
    vllm = SimpleNamespace(procedure=Procedure.model_validate(procedure_section("vllm", "greedy")))
    assert adaptive_wording(vllm, 0.65) == "stop drafting when drafter confidence < 0.65"
