"""llama.cpp's n-gram types beside a draft model (drafters.ngram_mix; spec `types+model`):
the spec and its refusals, the engine's order (an n-gram draft first, the model only when
none drafted), the walk against the real loop under greedy decoding (token-identical
output, equal counts), and the serving-config reader of `-md … --spec-type
ngram-*,draft-simple`."""

from __future__ import annotations

from pathlib import Path

import pytest

from specprobe.core.errors import ConfigError
from specprobe.drafters.ngram import NgramDrafter
from specprobe.drafters.ngram_mix import MixedDrafter, check_mixed, is_mixed_spec
from specprobe.metrics.sampling import Sampling
from specprobe.probe.ngram import ModelTrace, Steps, model_trace, walk, walk_mixed
from specprobe.settings.serving import read_serving_config
from tests.helpers import read_serving_text
from tests.test_simulate import hf_greedy, rand_prompts, tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")
GREEDY = Sampling(temperature=0.0)


class _Model:
    """A causal-LM drafter as build_drafter gives one (name, step model)."""

    def __init__(self, lm) -> None:
        self.lm, self.name = lm, "tiny-draft"

    def step_model(self):
        return self.lm


def test_the_spec_and_what_llama_cpp_does_not_run() -> None:
    assert is_mixed_spec("ngram-simple:size_n=4,ngram-mod+./draft.gguf") and not is_mixed_spec("./draft+b.gguf")
    ngram, model = check_mixed("ngram-mod,ngram-simple:size_n=4+self:layers=2")
    assert [t.name for t in ngram.types] == ["ngram-simple", "ngram-mod"] and model == "self:layers=2"
    for bad, why in [
        ("ngram:min=2+./d.gguf", "only llama.cpp lists a draft model"),
        ("sglang-ngram+./d.gguf", "only llama.cpp lists a draft model"),
        ("ngram-simple+", "names no draft model"),
        ("ngram-simple+ngram-mod", "one draft model after the"),
    ]:
        with pytest.raises(ConfigError, match=why):
            check_mixed(bad)


def test_an_ngram_draft_comes_first_the_model_drafts_when_none_does() -> None:
    """Hand-made: ngram-simple (size_n 1, size_m 2) matches the repeated 5 and drafts [6 7];
    elsewhere the model drafts its top tokens (the trace), accepted while they match."""
    prompt = [9, 5, 6, 7, 8, 1, 2, 3, 4, 10, 11]
    cont = [12, 13, 5, 6, 7, 14]
    # trace[j]: the model's top token where cont[j] comes next; right at 1 (13) and 3 (6)
    trace = ModelTrace(top=[0, 13, 99, 6, 7, 0], p=[0.9] * 6)
    s = walk_mixed(NgramDrafter("ngram-simple:size_n=1,size_m=2").slot(), trace, prompt, cont, max_new_tokens=64, k=2)
    # t=1 after [.., 12]: no n-gram match -> the model drafts [13, 99]: 1 accepted (then 5)
    # t=3 after [.., 5]: ngram-simple drafts [6, 7] (the prompt's 5 6 7): both accepted, then 14
    assert (s.steps, s.drafts, s.drafted, s.accepted, s.model_drafts) == (2, 2, 4, 3, 1)
    assert s.model_forwards == 2 + 2  # one catch-up a step, two forwards for the model's draft
    assert s.by_length == {2: 2}
    # p_min 0.95: the model's tokens are all under it, so it drafts nothing
    low = walk_mixed(NgramDrafter("ngram-simple:size_n=1,size_m=2").slot(), trace, prompt, cont, 64, k=2, p_min=0.95)
    assert low.model_drafts == 0 and low.drafts == 1


@pytest.fixture(scope="module")
def case():
    target, draft = tiny(0), tiny(1)
    prompts = [p + p for p in rand_prompts(4, seed=3)]
    return target, draft, prompts, hf_greedy(target, prompts, 20)


@pytest.mark.parametrize("k", [1, 3])
def test_the_walk_is_the_greedy_loop(case, k) -> None:
    """Greedy, p_min 0: the walk along the target's greedy text counts what the real loop
    counts, and the loop's output is plain decoding's token for token."""
    from specprobe.simulate import speculate

    target, draft, prompts, refs = case
    spec = "ngram-simple:size_n=1,size_m=4,ngram-map-k:size_n=1,size_m=3"
    mixed = MixedDrafter(f"{spec}+tiny", NgramDrafter(spec), _Model(draft))
    total = Steps()
    for p, c in zip(prompts, refs, strict=True):
        total.add(walk_mixed(NgramDrafter(spec).slot(), model_trace(draft, p, c, 300), p, c, 20, k))
    run = speculate(target, mixed.with_k(k), prompts, k=mixed.width(k), target_sampling=GREEDY, max_new_tokens=20, batch_size=4)
    c = run.counters
    assert run.outputs == refs
    assert (c.verify_steps - len(prompts), c.num_drafts, c.drafted_tokens, c.accepted_tokens) == (total.steps, total.drafts, total.drafted, total.accepted)
    assert 0 < total.model_drafts < total.drafts  # both sides drafted
    plain = Steps()  # without the model: fewer drafts
    for p, cont in zip(prompts, refs, strict=True):
        plain.add(walk(NgramDrafter(spec).slot(), p, cont, 20))
    assert plain.drafts == total.drafts - total.model_drafts


def test_a_llama_server_mix_reads_as_the_mixed_spec(tmp_path: Path) -> None:
    sv = read_serving_text(tmp_path, "l.sh", "llama-server -m t.gguf -md d.gguf --spec-type draft-simple,ngram-mod,ngram-simple --spec-ngram-simple-size-n 4 --spec-draft-n-max 8\n")
    assert sv.drafter_spec == "ngram-mod,ngram-simple:size_n=4+d.gguf"  # as written; run in the engine's order:
    ngram, model = check_mixed(sv.drafter_spec)
    assert [t.label() for t in ngram.types] == ["ngram-simple:size_n=4,size_m=48,min_hits=1", "ngram-mod:n_match=24,n_min=48,n_max=64"] and model == "d.gguf"
    assert sv.num_speculative_tokens == 8  # the model's n_max: the run's K
    plain = read_serving_text(tmp_path, "p.sh", "llama-server -m t.gguf -md d.gguf --spec-type draft-simple\n")
    assert plain.drafter_spec == "d.gguf"


def test_a_mixed_result_exports_as_the_llama_server_launch(tmp_path: Path) -> None:
    from specprobe.core.errors import InputError
    from specprobe.export.serving import export_config
    from tests.test_export import _result

    r, src = _result(tmp_path, kind="ngram", spec="ngram-simple:size_n=4,size_m=8+d.gguf", engine="llama.cpp")
    out = tmp_path / "m.args"
    out.write_text(export_config(r, src, "llama.cpp").text)
    sv = read_serving_config(out)
    ngram, model = check_mixed(sv.drafter_spec or "")
    assert model == "d.gguf" and [t.label() for t in ngram.types] == ["ngram-simple:size_n=4,size_m=8,min_hits=1"]
    assert sv.num_speculative_tokens == r.best_k
    with pytest.raises(InputError, match="only llama.cpp tries n-gram types beside a draft model"):
        export_config(r, src, "vllm")


def test_diagnose_and_simulate_a_mix(tiny_pair, tmp_path) -> None:
    """diagnose walks the mix (K rows: the model's n_max), priced with the draft model's
    timed step; simulate measures it at each --k, the walk's τ equal to the loop's (greedy)."""
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags, SimulateConfig
    from specprobe.simulate import run_simulate
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl")
    spec = f"ngram-simple:size_n=1,size_m=4+{tiny_pair['twin']}"
    dcfg = DiagnoseConfig(target=str(tiny_pair["target"]), drafter=spec, prompts=str(pf), max_new_tokens=16, batch_size=1, keep_positions=False, k_max=3, sampling=SamplingFlags(temperature=0.0))
    r = run_simulate(SimulateConfig(dcfg, ks=[2]))
    assert r.scored and r.drafter.kind == "ngram" and [row.k for row in r.k_table] == [1, 2, 3]
    assert r.cost is not None and r.cost.cost_ratio is not None and r.cost.cost_ratio > 0  # the draft model's step, timed
    rows = r.measured.k_table
    assert [row.k for row in rows] == [2]
    est = next(row for row in r.k_table if row.k == 2)
    # close, not equal: here the draft model (the target's twin) drafts on past the end of
    # generation and the loop counts those drafts accepted (its output stops at EOS),
    # where the walk's reference ends; the rest is equal to the count (one request of
    # this set, 6 accepted against 5; test_the_walk_is_the_greedy_loop without an EOS)
    assert rows[0].accept_rate == pytest.approx(est.accept_rate, abs=0.05)
    assert rows[0].tau_tokens == pytest.approx(est.tau_tokens, abs=0.1)
