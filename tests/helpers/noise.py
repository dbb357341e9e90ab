"""A real result with its standard errors set to known values, or taken away: what the
reports and `compare` draw and judge, whatever the pipeline computed for them."""

from __future__ import annotations

from specprobe.result import Result


def with_standard_errors(
    r: Result,
    *,
    depth_se: float = 0.01,
    thin_from: int | None = None,
    tau_se: float | None = 0.05,
    rate_se: float | None = 0.02,
    speedup_se: float | None = 0.03,
    tau_scale: float = 1.0,
) -> Result:
    """`r` as a result that kept its standard errors: depth j's cumulative r_j has
    depth_se·j, depths from `thin_from` on (1-based) are thin, every K row has the given
    τ, acceptance and speedup errors; a simulate result's measured rows and curve too.
    `tau_scale` multiplies every K row's renewal τ and the headline τ (a candidate whose
    τ moved)."""
    upd: dict[str, object] = {}
    if r.depth is not None:
        n = len(r.depth.depth)
        upd["depth"] = r.depth.model_copy(update={
            "cumulative_se": [depth_se * (j + 1) for j in range(n)],
            "thin": [thin_from is not None and j + 1 >= thin_from for j in range(n)],
        })
    upd["k_table"] = [
        row.model_copy(update={
            "tau_renewal_tokens": None if row.tau_renewal_tokens is None else row.tau_renewal_tokens * tau_scale,
            "tau_renewal_se": tau_se, "accept_rate_renewal_se": rate_se, "speedup_se": speedup_se,
        })
        for row in r.k_table
    ]
    if tau_scale != 1.0 and r.metrics.get("tau_tokens") is not None:  # the headline τ is the best K's renewal τ
        upd["metrics"] = {**r.metrics, "tau_tokens": r.metrics["tau_tokens"] * tau_scale}
    m = r.measured
    if m is not None:
        mupd: dict[str, object] = {"k_table": [row.model_copy(update={"tau_se": tau_se, "speedup_se": speedup_se, "accept_rate_se": rate_se, "seeds": 2}) for row in m.k_table]}
        if m.depth is not None:
            n = len(m.depth.depth)
            mupd["depth"] = m.depth.model_copy(update={"cumulative_se": [depth_se * (j + 1) for j in range(n)], "thin": [thin_from is not None and j + 1 >= thin_from for j in range(n)]})
        upd["measured"] = m.model_copy(update=mupd)
    return r.model_copy(update=upd)


def without_standard_errors(r: Result) -> Result:
    """`r` as a result written before standard errors were kept."""
    out = with_standard_errors(r, tau_se=None, rate_se=None, speedup_se=None)
    upd: dict[str, object] = {"k_table": [row.model_copy(update={"per_position_renewal": [], "per_position_renewal_se": []}) for row in out.k_table]}
    if out.depth is not None:
        upd["depth"] = out.depth.model_copy(update={"cumulative_se": [], "thin": []})
    if out.measured is not None:
        md = out.measured.depth
        upd["measured"] = out.measured.model_copy(update={
            "k_table": [row.model_copy(update={"tau_se": None, "speedup_se": None, "accept_rate_se": None, "seeds": 1}) for row in out.measured.k_table],
            **({"depth": md.model_copy(update={"cumulative_se": [], "thin": []})} if md is not None else {}),
        })
    return out.model_copy(update=upd)
