"""The dispatch table (`metrics.dispatch`): which implementation scores a chunk, by device,
dtype, sampling truncation, head vocabulary, numba and the SPECPROBE_SCORER /
SPECPROBE_FUSED switches; and `position_metrics` running what it picks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specprobe.metrics import core, dispatch
from specprobe.metrics.dispatch import Scorer
from specprobe.metrics.sampling import Sampling

WARM = Sampling(temperature=0.7)
TOP_P = Sampling(temperature=0.7, top_p=0.9)
GREEDY = Sampling(temperature=0.0)
CPU, GPU = torch.device("cpu"), torch.device("cuda")  # a case names a device; none is used


def _case(device: torch.device = CPU, dtype: torch.dtype = torch.float32, ts: Sampling = WARM, ds: Sampling = WARM, head: dispatch.Head = "") -> dispatch.Case:
    return dispatch.Case(device, dtype, ts, ds, head)


@pytest.fixture
def rows_work(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """The compiled rows importable and working, or not (numba need not be installed)."""
    state = {"on": True}
    monkeypatch.setitem(dispatch._NUMBA, "kernel", SimpleNamespace(enabled=lambda: state["on"]))  # type: ignore[arg-type]
    monkeypatch.delenv("SPECPROBE_SCORER", raising=False)
    monkeypatch.delenv("SPECPROBE_FUSED", raising=False)
    return state


def _picks(*cases: dispatch.Case) -> list[Scorer]:
    return [dispatch.pick(c).scorer for c in cases]


def test_the_default_table(rows_work: dict[str, bool]) -> None:
    assert _picks(
        _case(), _case(dtype=torch.bfloat16), _case(dtype=torch.float16), _case(ts=GREEDY, ds=GREEDY),
        _case(ts=Sampling(temperature=0.0, top_k=5)),  # a greedy side's truncation is moot
    ) == [Scorer.ROWS] * 5
    assert _picks(_case(device=GPU), _case(dtype=torch.float64), _case(ts=TOP_P), _case(ds=TOP_P), _case(ts=GREEDY, ds=TOP_P)) == [Scorer.BLOCKS] * 5
    # heads: a draft vocabulary always keeps its own path; a full-vocabulary head goes
    # the ordinary way exactly where the compiled rows take it
    assert _picks(_case(head="draft"), _case(head="draft", device=GPU), _case(head="full"), _case(head="full", device=GPU), _case(head="full", ts=TOP_P)) == [
        Scorer.HEAD, Scorer.HEAD, Scorer.ROWS, Scorer.HEAD, Scorer.HEAD]
    rows_work["on"] = False  # failed to compile earlier in the process
    assert _picks(_case(), _case(head="full")) == [Scorer.BLOCKS, Scorer.HEAD]


def test_switches_and_their_reasons(rows_work: dict[str, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROBE_SCORER", "torch")
    assert _picks(_case(), _case(head="full"), _case(head="draft")) == [Scorer.BLOCKS, Scorer.HEAD, Scorer.HEAD]
    assert "SPECPROBE_SCORER" in (dispatch.rows_refuse(_case()) or "")
    monkeypatch.delenv("SPECPROBE_SCORER")
    monkeypatch.setenv("SPECPROBE_FUSED", "1")  # before the rows, never for truncation nor a head's own path
    assert _picks(_case(), _case(device=GPU), _case(head="full"), _case(ts=TOP_P), _case(head="draft"), _case(head="full", device=GPU)) == [
        Scorer.FUSED, Scorer.FUSED, Scorer.FUSED, Scorer.BLOCKS, Scorer.HEAD, Scorer.HEAD]
    assert dispatch.pick(_case(), among=(Scorer.ROWS, Scorer.BLOCKS)).scorer is Scorer.ROWS  # metrics.blocked's own choice
    monkeypatch.delenv("SPECPROBE_FUSED")
    assert dispatch.rows_refuse(_case()) is None
    for c, says in ((_case(device=GPU), "CPU"), (_case(ts=TOP_P), "truncating"), (_case(dtype=torch.float64), "float32")):
        assert says in (dispatch.rows_refuse(c) or ""), c
    monkeypatch.setitem(dispatch._NUMBA, "kernel", None)  # numba not importable
    assert "numba" in (dispatch.rows_refuse(_case()) or "") and _picks(_case()) == [Scorer.BLOCKS]
    assert all(r.why for r in dispatch.ROUTES) and all(why for _, why in dispatch.ROWS_REFUSE)


def test_the_case_of_logits() -> None:
    tl, dl = torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(2, 8)
    assert dispatch.case(tl, dl, WARM, TOP_P).dtype == torch.float32  # promoted, as the scorer does
    assert dispatch.case(tl, None, WARM, WARM, "full") == dispatch.Case(CPU, torch.bfloat16, WARM, WARM, "full")
    assert dispatch.case(tl, dl, WARM, TOP_P).truncates and not dispatch.case(tl, dl, GREEDY, Sampling(temperature=0.0, top_p=0.5)).truncates


def test_position_metrics_runs_what_the_table_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECPROBE_FUSED=1: the fused function (here its formula, uncompiled) takes the
    chunk; truncating sampling does not reach it."""
    g = torch.Generator().manual_seed(2)
    tl = torch.randn(12, 300, generator=g) * 3
    dl = tl + torch.randn(12, 300, generator=g)
    calls: list[int] = []

    def formula(*a: object) -> tuple[torch.Tensor, ...]:
        calls.append(1)
        return core._fused_body(*a)  # type: ignore[arg-type]

    monkeypatch.setitem(core._FUSED, "fn", formula)
    monkeypatch.setitem(core._FUSED, "broken", None)
    monkeypatch.setenv("SPECPROBE_FUSED", "1")
    got, want = core.position_metrics(tl, dl, WARM, WARM, top=3), core.position_metrics_reference(tl, dl, WARM, WARM, top=3)
    assert calls == [1]
    for f in ("accept_prob", "greedy_agree", "kl_target_draft_nats", "target_entropy_nats", "draft_confidence"):
        torch.testing.assert_close(getattr(got, f), getattr(want, f), atol=1e-5, rtol=1e-5, msg=f)
    torch.testing.assert_close(core.position_metrics(tl, dl, TOP_P, WARM).accept_prob, core.position_metrics_reference(tl, dl, TOP_P, WARM).accept_prob, atol=1e-5, rtol=1e-5)
    assert calls == [1]
