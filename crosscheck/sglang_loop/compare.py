"""Compare the two sides' records field by field and print a summary table.

    python compare.py SCENARIOS.jsonl SGLANG.jsonl KVADMIT.jsonl [--mismatches OUT.jsonl] [--label L]

Each record is a list of events [kind, launched, ...] (launched: batches launched when it happened):
  B  a launched batch: kind (prefill | decode), [rid, extend length] rows, the new-token ratio then
  R  a retraction: rids, #new_tokens_gained, ratio before, ratio after
  A  a last-request abort: rid
  F  a request's end: rid, length | stop | abort
  L  a log line (Prefill batch, Decode batch, retraction), timestamps and throughputs left out
  S  a decode pass skipped (overlap: a finisher in flight freed the memory the check lacked)
  H  the queue's head cannot run even in an empty pool: SGLang waits forever (the harness then aborts it
     as a client would), kvadmit ends it at once
  I  a request handed to the scheduler; C  a client abort handed to it
  X  the scheduler raised "Out of memory" (SGLang's server dies there): the message; the run ends
Events are compared per kind, in order, with exact equality (floats bit for bit). A scenario's first
differing event of each kind is reported.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

CATEGORIES = {
    "B": "batches",
    "R": "retractions",
    "A": "last-request aborts",
    "F": "finishes",
    "L": "log lines",
    "S": "decode skips",
    "H": "hangs (SGLang waits)",
    "I": "arrivals",
    "C": "client aborts",
    "X": "out-of-memory crashes",
}


FEATURES = ("priority scheduling", "mixed chunks")


def features(server: dict) -> list[str]:
    """The scenario's optional features (gen.py --priority, --mixed), for the per-feature lines."""
    on = [server.get("enable_priority_scheduling"), server.get("enable_mixed_chunk")]
    return [name for name, flag in zip(FEATURES, on, strict=True) if flag]


def split(events: list) -> dict[str, list]:
    out: dict[str, list] = {k: [] for k in CATEGORIES}
    for e in events:
        out[e[0]].append(e)
    # Requests that end at the same moment: their order is how the recorder walked them, not a decision.
    out["F"].sort(key=lambda e: (e[1], e[2]))
    return out


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def compare_one(a: dict, b: dict) -> dict[str, tuple]:
    """Category -> (index, sglang event, kvadmit event) of the first difference."""
    diffs: dict[str, tuple] = {}
    if "error" in a or "error" in b:
        diffs["error"] = (0, a.get("error"), b.get("error"))
        return diffs
    sa, sb = split(a["events"]), split(b["events"])
    for k in CATEGORIES:
        xa, xb = sa[k], sb[k]
        for i in range(max(len(xa), len(xb))):
            ea = xa[i] if i < len(xa) else None
            eb = xb[i] if i < len(xb) else None
            if ea != eb:
                diffs[k] = (i, ea, eb)
                break
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenarios")
    ap.add_argument("sglang")
    ap.add_argument("kvadmit")
    ap.add_argument("--mismatches")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    scen, sg, kv = read_jsonl(a.scenarios), read_jsonl(a.sglang), read_jsonl(a.kvadmit)
    assert len(scen) == len(sg) == len(kv), (len(scen), len(sg), len(kv))
    counts: Counter = Counter()
    by_feature: Counter = Counter()  # (feature, "scenarios" | "steps" | "differing")
    mism: Counter = Counter()
    bad_scen = 0
    errors = 0
    differing: list[str] = []
    for sc, x, y in zip(scen, sg, kv, strict=True):
        assert sc["id"] == x["id"] == y["id"]
        if "error" in x or "error" in y:
            errors += 1
        else:
            for e in x["events"]:
                counts[e[0]] += 1
        d = compare_one(x, y)
        for feature in features(sc["server"]):
            by_feature[feature, "scenarios"] += 1
            by_feature[feature, "steps"] += sum(e[0] == "B" for e in x.get("events", []))
            by_feature[feature, "differing"] += bool(d)
        if d:
            bad_scen += 1
            for k in d:
                mism[k] += 1
            differing.append(json.dumps({"scenario": sc, "first_differences": dict(d)}) + "\n")
    if a.mismatches:
        with open(a.mismatches, "w") as out:
            out.writelines(differing)
    steps = counts["B"]
    print(
        f"{a.label}scenarios {len(scen)}, launched batches (steps) {steps}, scenarios with a mismatch "
        f"{bad_scen}, errors {errors}"
    )
    print(f"  {'category':<22}{'events (SGLang)':>16}{'scenarios differing':>22}")
    for k, name in CATEGORIES.items():
        print(f"  {name:<22}{counts[k]:>16}{mism[k]:>22}")
    if errors:
        print(f"  {'errors':<22}{'':>16}{mism['error']:>22}")
    for feature in FEATURES:
        if by_feature[feature, "scenarios"]:
            print(
                f"  with {feature}: {by_feature[feature, 'scenarios']} scenarios, "
                f"{by_feature[feature, 'steps']} steps, {by_feature[feature, 'differing']} differing"
            )
    return 1 if bad_scen or errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
