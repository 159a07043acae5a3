"""Is the doctor's what-if closer to actually running the changed flag than chance allows? (issue 21)

For each what-if of tests/test_doctor_roundtrip.py and five seeds of its workload (the lengths and the
send times drawn anew): the log made with the server's flags, the doctor's what-if from that log, and the
actual run with the changed flag, every metric over the log's window. The actual runs' spread over the
seeds is the run-to-run chance; the what-if's error on each seed is set against it. "today" is the
replay of the reconstruction against the log itself.

    usage: python benchmarks/doctor_whatif_seeds.py [--seeds N] [--output FILE | -]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from machine import cpu_model, publish

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import test_doctor_roundtrip as rt  # noqa: E402  (the cases the tests check)
from kvadmit.doctor.diagnose import Inputs, diagnose  # noqa: E402
from kvadmit.doctor.prove import prove  # noqa: E402
from kvadmit.doctor.whatif import Scenario  # noqa: E402

Sample = dict[str, float]
BIAS_BOUND = 0.10  # the "within 10% of actually running the changed flag"


def one_seed(case: rt.Case, name: str, seed: int, tmp: str) -> dict[str, tuple[Sample, Sample]]:
    """label -> (what-if, actual) for the case's what-ifs at this seed, and "today" -> (replay, log)."""
    c = rt.Case(case.args, replace(case.spec, seed=seed), case.rate)
    lines, result = rt.run_case(c)
    path = os.path.join(tmp, f"{name}-{seed}.log")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    scenarios = [Scenario(label, "user", changed) for n, label, changed, _ in rt.WHAT_IFS if n == name]
    proof = prove(path, diagnose(Inputs(log=path)).verdict, scenarios)
    rec = proof.reconstruction
    assert rec is not None
    window = (rec.window[0], rec.window[0] + rec.span_s)
    out = {"today": (rt.predicted_metrics(proof.outcomes[0]), rt.actual_metrics(lines, result, window))}
    for o in proof.outcomes[1:]:
        if o.scenario.source != "user":
            continue
        alines, aresult = rt.run_case(c, **o.scenario.overrides)
        out[o.scenario.label] = (rt.predicted_metrics(o), rt.actual_metrics(alines, aresult, window))
    return out


def _err(what: float, act: float, metric: str) -> str:
    if metric == "retractions" and act < rt.FEW_RETRACTIONS:
        return f"{what:.0f}/{act:.0f}"
    return f"{100 * (what - act) / act:+.0f}%" if act else ("0" if not what else "∞")


def bias(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """The what-if's mean error over the seeds, relative to the actual runs' mean, and its standard error:
    (mean(w - a) / mean(a), sd(w - a) / sqrt(n) / mean(a)). A seed's own error mixes the what-if's bias with
    both runs' chance; over n seeds the chance shrinks by sqrt(n) and the bias stays."""
    diffs = [w - a for w, a in pairs]
    mean_act = statistics.fmean(a for _, a in pairs)
    if not mean_act:
        return 0.0, 0.0
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return statistics.fmean(diffs) / mean_act, se / mean_act


def bias_verdict(rel: float, rel_se: float) -> str:
    """'within 10%' when the mean error is; else 'within chance' when it is inside 2 standard errors; else
    'MISSED'."""
    if abs(rel) <= BIAS_BOUND:
        return "within 10%"
    return "within chance" if abs(rel) <= 2 * rel_se else "MISSED"


def table(samples: dict[tuple[str, str], list[tuple[Sample, Sample]]]) -> list[str]:
    rows = [
        "| log | what if | metric | actual over seeds: mean ± sd (sd/mean) | what-if vs actual, each seed | "
        "largest | mean error ± se | mean error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (name, label), runs in samples.items():
        for metric in rt.ALL:
            acts = [a[metric] for _, a in runs]
            mean, sd = statistics.fmean(acts), statistics.stdev(acts)
            rel = f"{100 * sd / mean:.0f}%" if mean else "–"
            errs = [_err(w[metric], a[metric], metric) for w, a in runs]
            worst = max((abs(w[metric] - a[metric]) / a[metric] for w, a in runs if a[metric]), default=0.0)
            shown = f"{mean:,.2f} ± {sd:,.2f}" if mean < 10 else f"{mean:,.0f} ± {sd:,.0f}"
            b, b_se = bias([(w[metric], a[metric]) for w, a in runs])
            rows.append(
                f"| {name} | {label} | {metric} | {shown} ({rel}) | {', '.join(errs)} | {100 * worst:.0f}% "
                f"| {100 * b:+.0f}% ± {100 * b_se:.0f}% | {bias_verdict(b, b_se) if mean else '–'} |"
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds per workload (from the tests' own seed on)")
    ap.add_argument("--output", default=str(HERE / "doctor_whatif_seeds.txt"))
    ns = ap.parse_args()
    load_before = os.getloadavg()[0]
    samples: dict[tuple[str, str], list[tuple[Sample, Sample]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in rt.CASES.items():
            for k in range(ns.seeds):
                for label, pair in one_seed(case, name, case.spec.seed + k, tmp).items():
                    samples.setdefault((name, label), []).append(pair)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# benchmarks/doctor_whatif_seeds.py: the what-if against the actual run, over seeds",
        f"date: {now}",
        f"machine: {cpu_model()}, {os.cpu_count()} cores shared with other jobs; Python "
        f"{platform.python_version()}",
        f"load average (1 min) before/after: {load_before:.1f} / {os.getloadavg()[0]:.1f}",
        "",
        f"Seeds: each workload's own seed and the {ns.seeds - 1} after it. TTFT and TPOT in ms, throughput "
        "in token/s, retractions a count over the window (under "
        f"{rt.FEW_RETRACTIONS}: what-if/actual, compared within chance 2 √(a + b)). 'today' is the replay "
        "against the log. 'mean error ± se': the what-if's error averaged over the seeds, against the actual "
        "runs' mean, and its standard error; 'within chance' where it exceeds 10% but not 2 se.",
        "",
        *table(samples),
    ]
    publish(out, ns.output)


if __name__ == "__main__":
    main()
