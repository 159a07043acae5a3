"""Compare kvadmit's answers with SGLang's (harness.py) answers, field by field, exactly (floats too).

    python compare.py SNAPSHOTS.jsonl KVADMIT.jsonl SGLANG.jsonl [--mismatches OUT.jsonl] [--summary OUT.json]
    python compare.py --total SUMMARY.json...

The first form prints the suite's one-line result (and its errors); --mismatches writes each differing
snapshot with both answers, --summary writes the counts for --total. The second form adds up suites,
prints the one-line result ("compared: N admission, M decode; mismatches: ...; errors: ...") and exits 1
when any field differs, either side failed on a snapshot, or nothing was compared.
"""

import argparse
import json
import sys
from collections import Counter

ADMISSION_FIELDS = [
    "admitted",
    "chunked",
    "extend_lens",
    "prefix_lens",
    "verdict",
    "stopped_at",
    "rem_total_tokens",
    "cur_rem_tokens",
    "rem_input_tokens",
    "rem_chunk_tokens",
]
DECODE_FIELDS = [
    "retract_called",
    "retracted",
    "aborted",
    "abort_message",
    "new_ratio",
    "kept",
    "new_tokens_gained",
]


def same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b  # True must not equal 1
    return a == b  # exact, floats included


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def compare(snaps, kv, sg, mismatch_out=None):
    assert len(snaps) == len(kv) == len(sg), (len(snaps), len(kv), len(sg))
    counts, field_mis, errors = Counter(), Counter(), Counter()
    for i, (s, k, g) in enumerate(zip(snaps, kv, sg, strict=True)):
        kind = s.get("check", "admission")
        if "error" in g or "error" in k:
            side = "sglang" if "error" in g else "kvadmit"
            errors[f"{kind} {side}: {(g.get('error') or k.get('error'))[:80]}"] += 1
            continue
        counts[kind] += 1
        fields = DECODE_FIELDS if kind == "decode" else ADMISSION_FIELDS
        bad = [f for f in fields if not same(k.get(f), g.get(f))]
        if not bad:
            continue
        counts[kind + "_mismatch"] += 1
        for f in bad:
            field_mis[f"{kind}.{f}"] += 1
        if mismatch_out is not None:
            record = {
                "i": i,
                "kind": kind,
                "fields": bad,
                "snapshot": s,
                "kvadmit": {f: k.get(f) for f in fields},
                "sglang": {f: g.get(f) for f in fields},
            }
            mismatch_out.write(json.dumps(record) + "\n")
    return counts, field_mis, errors


def one_line(admission, decode, field_mis, errors):
    mis = ", ".join(f"{f} {n}" for f, n in sorted(field_mis.items())) or "0"
    return f"compared: {admission} admission, {decode} decode; mismatches: {mis}; errors: {errors}"


def total(paths):
    adm = dec = err = 0
    field_mis = Counter()
    for p in paths:
        with open(p) as f:
            s = json.load(f)
        adm += s["admission"]
        dec += s["decode"]
        err += sum(s["errors"].values())
        field_mis.update(s["field_mismatches"])
    print(one_line(adm, dec, field_mis, err))
    return 0 if (adm + dec) > 0 and not field_mis and not err else 1


def main():
    if sys.argv[1:2] == ["--total"]:
        sys.exit(total(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshots")
    ap.add_argument("kvadmit")
    ap.add_argument("sglang")
    ap.add_argument("--mismatches", help="write differing snapshots here (JSONL)")
    ap.add_argument("--summary", help="write the counts here (JSON) for --total")
    args = ap.parse_args()
    snaps, kv, sg = read_jsonl(args.snapshots), read_jsonl(args.kvadmit), read_jsonl(args.sglang)
    out = open(args.mismatches, "w") if args.mismatches else None  # noqa: SIM115
    try:
        counts, field_mis, errors = compare(snaps, kv, sg, out)
    finally:
        if out is not None:
            out.close()
    print(one_line(counts["admission"], counts["decode"], field_mis, sum(errors.values())))
    for e, n in errors.most_common():
        print(f"  error x{n}: {e}")
    if field_mis and args.mismatches:
        print(f"  differing snapshots with both answers: {args.mismatches}")
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(
                {
                    "admission": counts["admission"],
                    "decode": counts["decode"],
                    "mismatched_snapshots": counts["admission_mismatch"] + counts["decode_mismatch"],
                    "field_mismatches": dict(field_mis),
                    "errors": dict(errors),
                },
                f,
            )


if __name__ == "__main__":
    main()
