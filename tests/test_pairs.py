"""Tiny real checkpoints on disk: identical, random, vocab-shuffled and hot-sampling twins
through the real loaders, alignment check and diagnose pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specprobe.probe.diagnose import run_diagnose
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
from tests.helpers.tiny import prompts_file


def _cfg(tiny_pair: dict[str, Path], drafter: str, tmp_path: Path, **kw) -> DiagnoseConfig:
    pf = prompts_file(tmp_path / "p.jsonl")
    base = dict(target=str(tiny_pair["target"]), drafter=drafter, prompts=str(pf), max_new_tokens=12, sampling=SamplingFlags(temperature=1.0), batch_size=4)
    base.update(kw)
    return DiagnoseConfig(**base)


def _ids(result: dict) -> set[str]:
    return {f.rule_id for f in result.findings}


def test_identical_pair_is_excellent(tiny_pair, tmp_path) -> None:
    # sampled drafts: an identical drafter's every draft is accepted (a greedy one's only
    # with the target's probability of its top token)
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, draft_sampling="probabilistic"))
    m = r.metrics
    assert r.scored and m["accept_prob_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["kl_target_draft_nats"] == pytest.approx(0.0, abs=1e-4)
    assert "SP206" in _ids(r)  # excellent band
    assert r.k_table[3].tau_tokens == pytest.approx(5.0, abs=1e-3)
    assert r.by_domain and r.by_entropy and r.by_position
    assert len(r.positions.accept_prob) == m["num_positions"]


def test_random_drafter_whose_pairing_is_sound_is_untrained_not_a_broken_pairing(tiny_pair, tmp_path) -> None:
    """A drafter with the target's tokenizer and vocabulary but random weights: every
    pre-flight check passes, so the verdict points to training (SP216, SP108), not to the
    pairing (SP201, SP101) that `check` just cleared."""
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["random"]), tmp_path))
    assert r.metrics["accept_prob_mean"] < 0.05 and r.metrics["alignment_errors"] == 0
    assert r.verdict == "not trained for this target"
    assert "SP216" in _ids(r) and "SP201" not in _ids(r) and "SP101" not in _ids(r)
    f = next(f for f in r.findings if f.rule_id == "SP216")
    assert "every pre-flight check passed" in f.message and "Train the drafter" in f.remedy


def test_vocab_shuffled_drafter_is_stopped_before_any_forward_pass(tiny_pair, tmp_path, monkeypatch) -> None:
    import specprobe.probe.diagnose as d
    import specprobe.probe.references as refs

    calls = []
    monkeypatch.setattr(d, "score", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(refs, "generate_references", lambda *a, **k: calls.append(1))
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["shuffled"]), tmp_path))
    assert not calls and not r.scored and "no forward pass" in r.stopped
    assert "SP003" in _ids(r) and r.verdict == "catastrophic mismatch"
    f = next(f for f in r.findings if f.rule_id == "SP003")
    assert f.measured["token_id_mismatch_frac"] > 0.9 and f.evidence


def test_forced_shuffled_drafter_scores_near_zero(tiny_pair, tmp_path) -> None:
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["shuffled"]), tmp_path, force=True))
    assert r.scored and r.metrics["accept_prob_mean"] < 0.1


def test_temperature_mismatch_follows_the_engines_drafting(tiny_pair, tmp_path) -> None:
    # the 'hot' drafter's own generation_config samples at 1.5, but engines sample both
    # models with the target's settings (1.0): reported at info level, not a mismatch
    r0 = run_diagnose(_cfg(tiny_pair, str(tiny_pair["hot"]), tmp_path))
    assert "SP012" not in _ids(r0) and r0.sampling.draft.temperature == 1.0
    assert next(f for f in r0.findings if f.rule_id == "SP018").severity == "info"
    # a drafter temperature set on the command line is what an engine that samples its
    # drafts would use
    hot = SamplingFlags(temperature=1.0, draft_temperature=1.5)
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["hot"]), tmp_path, sampling=hot, draft_sampling="probabilistic"))
    f = next(f for f in r.findings if f.rule_id == "SP012")
    assert f.severity == "error" and f.measured["temperature_abs_diff"] == pytest.approx(0.5)
    assert r.sampling.sources["draft.temperature"] == "flag"
    # vLLM drafts greedily by default: the same flag changes nothing it proposes (info)
    rg = run_diagnose(_cfg(tiny_pair, str(tiny_pair["hot"]), tmp_path, sampling=hot))
    assert "SP012" not in _ids(rg) and next(f for f in rg.findings if f.rule_id == "SP030").severity == "info"
    # greedy drafter against a sampling target, where the drafts are sampled
    greedy = SamplingFlags(temperature=0.8, draft_temperature=0.0)
    r2 = run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, sampling=greedy, draft_sampling="probabilistic"))
    assert "SP013" in _ids(r2)
    assert "SP013" not in _ids(run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, sampling=greedy, engine="llama.cpp")))


def test_layer_skip_matches_a_real_truncated_model(tiny_pair) -> None:
    import torch

    from specprobe.drafters.base import TargetPass
    from specprobe.models.drafters import build_drafter
    from specprobe.models.loader import load_model

    target = load_model(str(tiny_pair["target"]))
    drafter = build_drafter("self:layers=1", target)
    ids = torch.tensor([[1, 5, 9, 30, 44, 7]])
    mask = torch.ones_like(ids)
    from specprobe.models.anatomy import capture_layers

    with torch.inference_mode():
        with capture_layers(target.model, (1,)) as captured:
            out = target.model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        assert torch.equal(captured[1], out.hidden_states[1])  # the hook sees hidden_states[N]
        tp = TargetPass(ids, mask, out.last_hidden_state, dict(captured))
        fast = drafter.logits(drafter.hidden(tp)[1], 1)
        real = drafter.step_model()(input_ids=ids).logits
    assert torch.allclose(fast, real, atol=1e-5)
    # shares memory with the target: no copy
    assert drafter.step_model().lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()


def test_dataset_references_are_labelled_off_policy(tiny_pair, tmp_path) -> None:
    pf = tmp_path / "ds.jsonl"
    pf.write_text('{"prompt": "w1 w2 w3", "domain": "qa", "response": "w4 w5 w6 w7"}\n{"prompt": "w8 w9", "domain": "code", "response": "w10 w11"}\n')
    r = run_diagnose(DiagnoseConfig(target=str(tiny_pair["target"]), drafter=str(tiny_pair["twin"]), prompts=str(pf), reference="dataset"))
    assert r.reference == "off-policy" and "SP210" in _ids(r)
    assert r.metrics["num_positions"] == 6


def test_references_are_cached_and_reproducible(tiny_pair, tmp_path, monkeypatch) -> None:
    """The second run reads the references from the cache (generate is never called); a
    run without the cache regenerates the same tokens from the seed; another seed gives
    other tokens — so the comparison below can tell them apart."""
    from transformers import GenerationMixin

    cfg = _cfg(tiny_pair, "self:layers=1", tmp_path, seed=3)
    a = run_diagnose(cfg)

    def no_generate(*_a, **_k):
        raise AssertionError("references should have come from the cache")

    with monkeypatch.context() as m:
        m.setattr(GenerationMixin, "generate", no_generate)
        b = run_diagnose(cfg)
    assert (b.positions.position, b.positions.accept_prob) == (a.positions.position, a.positions.accept_prob)
    c = run_diagnose(_cfg(tiny_pair, "self:layers=1", tmp_path, seed=3, use_cache=False))
    assert (c.positions.position, c.positions.accept_prob) == (a.positions.position, a.positions.accept_prob)
    d = run_diagnose(_cfg(tiny_pair, "self:layers=1", tmp_path, seed=4))
    assert (d.positions.position, d.positions.accept_prob) != (a.positions.position, a.positions.accept_prob)


def test_head_style_drafter_scores_each_depth(tiny_pair, tmp_path) -> None:
    """A head drafter (reads target hidden states, predicts depth d directly) fits the
    interface: an oracle head that sees the target's state at the predicted position is
    accepted at every depth; a head that is right only at depth 1 decays to chance."""
    from specprobe.core.progress import Progress
    from specprobe.drafters.base import Drafter
    from specprobe.probe.diagnose import load_pair

    class OracleHeads(Drafter):
        kind = "medusa"
        head_depths = (1, 2, 3, 4)

        def __init__(self, target, good_depths):
            super().__init__("oracle-heads", target)
            self.good = good_depths

        @property
        def info(self):
            return self.target.info

        def hidden(self, tp):
            import torch

            h = tp.last_hidden
            out = {}
            for d in self.head_depths:
                # feature at t for depth d = the target's own state at t+d−1 (an oracle)
                shifted = torch.cat([h[:, d - 1 :], h[:, -1:].expand(-1, d - 1, -1)], dim=1)
                out[d] = shifted if d in self.good else torch.flip(h, dims=[-1])
            return out

        def logits(self, hidden, depth):
            return self.target.model.get_output_embeddings()(hidden)

    cfg = _cfg(tiny_pair, "self", tmp_path, k_max=4, draft_sampling="probabilistic")
    base = load_pair(cfg, Progress())
    good = run_diagnose(cfg, pair=type(base)(base.target, OracleHeads(base.target, {1, 2, 3, 4}), base.sampling, base.alignment))
    assert good.depth.cumulative == pytest.approx([1.0, 1.0, 1.0, 1.0], abs=1e-4)
    bad = run_diagnose(cfg, pair=type(base)(base.target, OracleHeads(base.target, {1}), base.sampling, base.alignment))
    assert bad.metrics["accept_prob_mean"] == pytest.approx(1.0, abs=1e-4)  # depth 1 is perfect
    assert bad.depth.cumulative[1] < 0.5  # depth 2 comes from a broken head, not depth 1 chained


def test_make_vocab_shuffled_writes_a_real_permuted_twin(tiny_pair, tmp_path) -> None:
    """The demo's broken drafter: the same weights in another id space. `check` stops it
    (SP003); forced scoring collapses acceptance; re-mapping ids recovers the target."""
    import torch

    from specprobe.models.loader import load_info, load_model
    from specprobe.probe.demo import make_vocab_shuffled

    target = load_model(str(tiny_pair["target"]))
    dest = make_vocab_shuffled(target, tmp_path / "shuffled")
    twin = load_model(str(dest))
    tv, dv = target.tokenizer.get_vocab(), twin.tokenizer.get_vocab()
    assert set(tv) == set(dv) and sum(tv[s] != dv[s] for s in tv) > 0.9 * len(tv)
    text = "w1 w2 w3 w4 w5"
    t_ids = torch.tensor([target.tokenizer(text)["input_ids"]])
    d_ids = torch.tensor([twin.tokenizer(text)["input_ids"]])
    with torch.inference_mode():
        lt = target.model(input_ids=t_ids).logits[0, -1]
        ld = twin.model(input_ids=d_ids).logits[0, -1]
    perm = torch.tensor([dv[s] for s, _ in sorted(tv.items(), key=lambda x: x[1])])
    assert torch.allclose(lt, ld[perm].to(lt.dtype), atol=0.5, rtol=0.02)  # bf16 weights: same model, ids permuted
    r = run_diagnose(_cfg(tiny_pair, str(dest), tmp_path))
    assert not r.scored and "SP003" in _ids(r)
    assert load_info(str(dest)).name == "shuffled"


def test_ctrl_c_keeps_what_was_computed(tiny_pair, tmp_path, monkeypatch) -> None:
    """Ctrl-C while scoring: the result covers the batches scored so far, marked
    interrupted. Ctrl-C while generating references: finished batches are scored, and
    they are cached so the next run does not regenerate them."""
    import specprobe.probe.references as refs
    import specprobe.probe.scoring as scoring

    real = scoring.position_metrics
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(scoring, "position_metrics", flaky)
    cfg = _cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, batch_size=2, seed=11)
    r = run_diagnose(cfg)
    assert r.interrupted and r.scored and 0 < r.metrics["num_prompts"] < 6
    monkeypatch.setattr(scoring, "position_metrics", real)

    gen_calls = {"n": 0}
    real_gen = refs._generate_batches

    def stop_after_first(target, encoded, batches, done, out, *rest):
        gen_calls["n"] += 1
        real_gen(target, encoded, batches[:1], done, out, *rest)
        raise KeyboardInterrupt

    monkeypatch.setattr(refs, "_generate_batches", stop_after_first)
    cfg2 = _cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, batch_size=2, seed=12)
    r2 = run_diagnose(cfg2)
    assert r2.interrupted and r2.metrics["num_prompts"] == 2
    monkeypatch.setattr(refs, "_generate_batches", real_gen)
    r3 = run_diagnose(cfg2)  # resumes: batch 0 from the cache, the rest generated now
    assert not r3.interrupted and r3.metrics["num_prompts"] == 6
    first = [x for x, pid in zip(r3.positions.position, r3.positions.prompt_id, strict=True) if pid in ("p0", "p1")]
    assert len(first) == r2.metrics["num_positions"]


def _two_turn_file(path: Path) -> Path:
    """MT-Bench's shape: two user turns per question, categories, a list reference."""
    import json

    from tests.helpers.tiny import WORDS

    lines = []
    for i in range(3):
        t1 = " ".join(WORDS[(i * 9 + j) % len(WORDS)] for j in range(5))
        t2 = " ".join(WORDS[(i * 13 + 2 * j) % len(WORDS)] for j in range(4))
        lines.append(json.dumps({"question_id": 81 + i, "category": "writing", "turns": [t1, t2], "reference": [t1]}))
    lines.append(json.dumps({"question_id": 90, "category": "math", "turns": [" ".join(WORDS[40:46])]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_second_turns_are_scored_after_the_targets_own_first_answers(tiny_pair, tmp_path) -> None:
    """MT-Bench: every second turn is scored, in a conversation holding the target's own
    on-policy answer to the first turn (greedy here, so the answer is reproducible)."""
    from specprobe.models.loader import load_model
    from specprobe.probe.references import encode_prompt
    from specprobe.prompts import load_prompts
    from specprobe.settings.pipeline import SamplingFlags

    pf = _two_turn_file(tmp_path / "mt.jsonl")
    cfg = _cfg(tiny_pair, "self", tmp_path, prompts=str(pf), sampling=SamplingFlags(temperature=0.0), max_new_tokens=5)
    r = run_diagnose(cfg)
    ids = list(dict.fromkeys(r.positions.prompt_id))
    assert sorted(ids) == sorted(["81", "82", "83", "90", "81#2", "82#2", "83#2"])
    assert r.metrics["num_prompts"] == 7
    # the turn-2 context is [turn 1, the target's greedy answer, turn 2]
    target = load_model(str(tiny_pair["target"]))
    q = next(p for p in load_prompts(str(pf)).prompts if p.id == "81")
    first = encode_prompt(target.tokenizer, q)
    with torch.inference_mode():
        ans = target.model.generate(torch.tensor([first]), max_new_tokens=5, do_sample=False, pad_token_id=3)[0, len(first) :].tolist()
    if 2 in ans:
        ans = ans[: ans.index(2) + 1]
    conv = encode_prompt(target.tokenizer, q, 1, [target.tokenizer.decode(ans, skip_special_tokens=True)])
    pos = [p for p, pid in zip(r.positions.position, r.positions.prompt_id, strict=True) if pid == "81#2"]
    assert pos[0] == len(conv)  # the first scored token of turn 2 sits right after that conversation


def test_dataset_references_score_first_turns_only(tiny_pair, tmp_path) -> None:
    pf = _two_turn_file(tmp_path / "mt.jsonl")
    lines = [ln for ln in pf.read_text().splitlines() if '"reference"' in ln]
    pf.write_text("\n".join(lines) + "\n")
    r = run_diagnose(_cfg(tiny_pair, "self", tmp_path, prompts=str(pf), reference="dataset"))
    assert set(r.positions.prompt_id) == {"81", "82", "83"}


def test_simulate_runs_the_same_turns_diagnose_scored(tiny_pair, tmp_path) -> None:
    from specprobe.settings.pipeline import SimulateConfig
    from specprobe.simulate import run_simulate

    pf = _two_turn_file(tmp_path / "mt.jsonl")
    d = _cfg(tiny_pair, "self", tmp_path, prompts=str(pf), sampling=SamplingFlags(temperature=0.0), max_new_tokens=4, keep_positions=False)
    r = run_simulate(SimulateConfig(d, ks=[2], baseline=False))
    assert r.metrics["num_prompts"] == 7
    assert r.measured is not None and r.measured.k_table[0].prompts == 7
