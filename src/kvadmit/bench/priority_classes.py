"""A block after the summary when requests carried priorities (--priority-mix): per priority, how many
succeeded and their TTFT and end-to-end latency (median and P99 in ms, interpolated as the summary's)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvadmit.bench.metrics import RequestOutcome


def render_priority_classes(outcomes: Sequence[RequestOutcome]) -> str | None:
    """The block, or None when no request carried a priority. Most urgent (largest value) first."""
    classes = sorted({o.priority for o in outcomes if o.priority is not None}, reverse=True)
    if not classes:
        return None
    lines = [f"{' By priority (ms) ':-^56}", f"{'Priority':>9} {'Done':>6} {'TTFT p50':>9} {'TTFT p99':>9} "
             f"{'E2E p50':>9} {'E2E p99':>9}"]  # fmt: skip
    for prio in classes:
        done = [o for o in outcomes if o.priority == prio and o.success]
        ttft = np.array([o.ttft for o in done] or [0.0]) * 1000
        e2e = np.array([o.latency for o in done] or [0.0]) * 1000
        t50, t99 = np.percentile(ttft, [50, 99])
        e50, e99 = np.percentile(e2e, [50, 99])
        lines.append(f"{prio:>9} {len(done):>6} {t50:>9.2f} {t99:>9.2f} {e50:>9.2f} {e99:>9.2f}")
    lines.append("=" * 56)
    return "\n".join(lines)
