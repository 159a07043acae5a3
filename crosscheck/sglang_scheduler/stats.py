"""Coverage of a suite: how often SGLang's answers (harness.py) went through each edge case, so that a
"0 mismatches" can be read against what was actually exercised.

    python stats.py SNAPSHOTS.jsonl SGLANG.jsonl [--summary OUT.json]
    python stats.py --total SUMMARY.json...

Counts: admission verdicts, chunked requests, prefix hits, fractional rem_total_tokens, the ignore_eos
path (radix cache off), retracted waiting requests; decode retractions, multi-request retractions and
aborts. With DIFF_PROBE=1 answers, also the exact-boundary hits of SGLang's fit tests: "fit_tot-rem=d"
(total_tokens - remaining_total in PrefillBudget.check_prefill) and "eos_paged-min=d" (paged input vs
min(remaining_current, remaining_total) in can_allocate_prefill) for d in -1, 0, 1, and the ignore_eos
path's occupancy rejections and unsorted request-state lists.
"""

import argparse
import json
import sys
from collections import Counter


def suite_counts(snaps, answers):
    c, boundary, eos = Counter(), Counter(), Counter()
    for s, a in zip(snaps, answers, strict=True):
        if "error" in a:
            c["error"] += 1
            continue
        if "verdict" in a:
            c["adm"] += 1
            c["verdict_" + a["verdict"]] += 1
            c["chunked"] += bool(a["chunked"])
            c["admitted_some"] += bool(a["admitted"])
            c["nothing_looked_at"] += not a["prefix_lens"]
            c["prefix_hit"] += any(v > 0 for v in a["prefix_lens"].values())
            rem = a["rem_total_tokens"]
            c["frac_rem_total"] += isinstance(rem, float) and not rem.is_integer()
            c["ignore_eos_path"] += s["server"]["disable_radix_cache"] and any(
                w["ignore_eos"] for w in s["waiting"]
            )
            c["has_retracted_waiting"] += any(w.get("output_len", 0) for w in s["waiting"])
        else:
            c["dec"] += 1
            c["retract"] += bool(a["retract_called"])
            c["abort"] += bool(a["aborted"])
            c["multi_retract"] += len(a["retracted"]) > 1
        for kind, lhs, rhs in a.get("probe", []):
            d = lhs - rhs
            if kind == "fit" and d in (0, -1, 1):
                boundary[f"fit_tot-rem={d:g}"] += 1
            elif kind == "eos_fit" and d in (0, -1, 1):
                boundary[f"eos_paged-min={d:g}"] += 1
            elif kind in ("eos_list_unsorted", "eos_occupancy_reject"):
                eos[kind] += 1
    return +c, boundary, eos


def show(c, boundary, eos):
    print(dict(c))
    print("boundary hits:", dict(sorted(boundary.items())))
    print("eos path:", dict(sorted(eos.items())))


def main():
    if sys.argv[1:2] == ["--total"]:
        c, boundary, eos = Counter(), Counter(), Counter()
        for p in sys.argv[2:]:
            with open(p) as f:
                s = json.load(f)
            c.update(s["counts"])
            boundary.update(s["boundary"])
            eos.update(s["eos"])
        show(c, boundary, eos)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshots")
    ap.add_argument("sglang")
    ap.add_argument("--summary", help="write the counts here (JSON) for --total")
    args = ap.parse_args()
    with open(args.snapshots) as f:
        snaps = [json.loads(line) for line in f if line.strip()]
    with open(args.sglang) as f:
        answers = [json.loads(line) for line in f if line.strip()]
    c, boundary, eos = suite_counts(snaps, answers)
    show(c, boundary, eos)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({"counts": c, "boundary": boundary, "eos": eos}, f)


if __name__ == "__main__":
    main()
