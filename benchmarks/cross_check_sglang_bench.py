"""Compare SGLang's bench_serving with `kvadmit bench` from their --output-file JSON lines.

Called by cross_check_sglang_bench.sh with the results folder; prints the comparison table. Each
configuration ran twice with each tool (alternating, against the same server): counts must be equal,
timings must differ by no more than the run-to-run spread measured here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EXACT = ("completed", "total_input_tokens", "total_output_tokens", "total_output_tokens_retokenized")
TIMED = (
    ("duration", "s"),
    ("request_throughput", "req/s"),
    ("output_throughput", "tok/s"),
    ("mean_e2e_latency_ms", "ms"),
    ("mean_ttft_ms", "ms"),
    ("median_ttft_ms", "ms"),
    ("mean_tpot_ms", "ms"),
    ("median_tpot_ms", "ms"),
    ("mean_itl_ms", "ms"),
    ("median_itl_ms", "ms"),
    ("concurrency", ""),
)
NOISE_FLOOR = 0.02  # two runs give a rough spread; differences under 2 % count as agreement


def runs(folder: Path, config: str, tool: str) -> list[dict[str, float]]:
    path = folder / f"{config}.{tool}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spread(a: float, b: float) -> float:
    mid = (a + b) / 2
    return abs(a - b) / mid if mid else 0.0


def fmt(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def compare(folder: Path, config: str) -> tuple[list[str], bool]:
    s, k = runs(folder, config, "sglang"), runs(folder, config, "kvadmit")
    if len(s) < 2 or len(k) < 2:
        return [f"| {config} | missing runs ({len(s)} sglang, {len(k)} kvadmit) | | | | | | | |"], False
    rows, ok = [], True
    for key in EXACT:
        values = [r[key] for r in (*s[-2:], *k[-2:])]
        same = len(set(values)) == 1
        ok &= same
        cells = " | ".join(fmt(v) for v in values)
        rows.append(f"| {config} | {key} | {cells} | 0 | 0 | {'equal' if same else 'DIFFERENT'} |")
    for key, unit in TIMED:
        s1, s2 = s[-2][key], s[-1][key]
        k1, k2 = k[-2][key], k[-1][key]
        noise = max(spread(s1, s2), spread(k1, k2))
        diff = spread((s1 + s2) / 2, (k1 + k2) / 2)
        within = diff <= max(noise, NOISE_FLOOR)
        ok &= within
        label = f"{key} ({unit})" if unit else key
        cells = " | ".join(fmt(v) for v in (s1, s2, k1, k2))
        verdict = "within noise" if within else "OUTSIDE noise"
        rows.append(f"| {config} | {label} | {cells} | {noise:.1%} | {diff:.1%} | {verdict} |")
    return rows, ok


def main() -> int:
    folder = Path(sys.argv[1])
    configs = sys.argv[2:]
    print("| config | metric | sglang 1 | sglang 2 | kvadmit 1 | kvadmit 2 | run-to-run spread | "
          "sglang vs kvadmit | verdict |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    all_ok = True
    for config in configs:
        rows, ok = compare(folder, config)
        all_ok &= ok
        print("\n".join(rows))
    print()
    print(
        "spread: the larger of the two tools' |run 1 − run 2| / mean; sglang vs kvadmit: |mean of sglang's "
        f"runs − mean of kvadmit's| / their mean; agreement: difference ≤ max(spread, {NOISE_FLOOR:.0%})"
    )
    print(
        f"result: {'all counts equal, all timings within noise' if all_ok else 'MISMATCH (see rows above)'}"
    )
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
