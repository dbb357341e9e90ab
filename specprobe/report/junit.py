"""JUnit XML for CI systems (Jenkins, GitLab, GitHub test reporters).

One <testcase> per rule evaluated. The file mirrors the gate: a rule whose finding is
at or above --fail-on is a <failure> (message = the diagnosis; body = measured values,
threshold, remedy); a rule that fired below that level passes with its diagnosis in
<system-out> (an "acceptance is good" info finding is not a failed test); a rule whose
metrics were not measured is <skipped>. classname groups rules by family so CI UIs
show "alignment", "acceptance", … as suites.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from specprobe.judge.catalog import format_value
from specprobe.judge.rules import SEVERITY_RANK, default_families, family_of
from specprobe.result import Comparison, Evaluation, Finding, Result


def _gates(severity: str, fail_on: str) -> bool:
    return fail_on != "never" and SEVERITY_RANK.get(severity, 0) >= SEVERITY_RANK[fail_on]


def _details(f: Finding) -> str:
    lines = [f"{f.rule_id} {f.name} ({f.severity})", f.message]
    for name, value in f.measured.items():
        shown = value if isinstance(value, str) else format_value(name, value)
        lines.append(f"measured: {name} = {shown}")
    lines.append(f"threshold: {f.threshold}")
    lines.append(f"remedy: {f.remedy}")
    lines.extend(f"evidence: {e}" for e in f.evidence)
    return "\n".join(lines)


def render_junit(result: Result | Comparison, *, fail_on: str | None = None, suite: str | None = None) -> str:
    """JUnit XML text for a diagnose/simulate/compare result."""
    fail_on = fail_on or result.config.fail_on or "error"
    findings = {f.rule_id: f for f in result.findings}
    evaluations = list(result.evaluations)
    if not evaluations:  # a partial result: at least the findings become cases
        evaluations = [Evaluation(rule_id=k, name=f.name, severity=f.severity, status="fail") for k, f in findings.items()]
    command = result.command
    if isinstance(result, Comparison):
        name = suite or f"specprobe compare: {result.candidate.describe} vs {result.baseline.describe}"
    else:
        name = suite or f"specprobe {command}: {result.describe()}"

    # a result keeps only rule ids: the shipped table's id prefixes name their families
    families = default_families()
    cases = []
    failures = skipped = 0
    for ev in evaluations:
        rid = ev.rule_id
        fam = family_of(rid, families) or "other"
        case = ET.Element("testcase", {"classname": f"specprobe.{fam}", "name": f"{rid} {ev.name}", "time": "0"})
        f = findings.get(rid)
        if ev.status == "fail" and f is not None and _gates(f.severity, fail_on):
            failures += 1
            el = ET.SubElement(case, "failure", {"message": f.message, "type": f.severity})
            el.text = _details(f)
        elif ev.status == "skipped":
            skipped += 1
            ET.SubElement(case, "skipped", {"message": "not evaluated: a metric it needs was not measured, or it does not apply to this drafter kind"})
        elif f is not None:
            out = ET.SubElement(case, "system-out")
            out.text = _details(f)
        cases.append(case)

    suites = ET.Element("testsuites", {"name": "specprobe", "tests": str(len(cases)), "failures": str(failures), "errors": "0", "skipped": str(skipped), "time": "0"})
    ts = ET.SubElement(suites, "testsuite", {
        "name": name, "tests": str(len(cases)), "failures": str(failures), "errors": "0", "skipped": str(skipped), "time": "0",
        "timestamp": result.created[:19],
    })
    props = ET.SubElement(ts, "properties")
    m = result.metrics
    for key, value in (("verdict", result.verdict), ("fail_on", fail_on), ("command", command), ("accept_prob_mean", m.get("accept_prob_mean")), ("kl_target_draft_nats", m.get("kl_target_draft_nats"))):
        if value is not None:
            ET.SubElement(props, "property", {"name": key, "value": str(value)})
    ts.extend(cases)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
