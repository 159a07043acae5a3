"""The load endpoints' shapes: the sections of SGLang 0.5.22's `/v1/loads` (`include=`), and the older
`GetLoadReqOutput` row of `/get_load` (0.5.9's `scheduler_metrics_mixin.get_load`, the last shape that
sglang-router 0.3.x reads). The snapshot itself and the counters behind it are observe/load_snapshot.py
(the simulated smg router reads them too)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kvadmit.observe.load_snapshot import pool_used

if TYPE_CHECKING:
    from kvadmit.scheduler.scheduler import Scheduler

# The sections `include=` may name (0.5.22's LoadSnapshot.VALID_SECTIONS) and the key each adds.
VALID_SECTIONS = ("all", "core", "disagg", "lora", "memory", "queues", "spec")
SECTION_KEYS = {"memory": "memory", "spec": "speculative", "lora": "lora", "disagg": "disaggregation",
                "queues": "queues"}  # fmt: skip


def sections(include: str | None) -> set[str] | None:
    """`include=a,b` as a set (None: everything); ValueError with 0.5.22's message for an unknown one."""
    if not include:
        return None
    wanted = {part.strip() for part in include.split(",")}
    unknown = wanted - set(VALID_SECTIONS)
    if unknown:
        raise ValueError(f"Invalid include sections: {unknown}. Valid options: {sorted(VALID_SECTIONS)}")
    return None if "all" in wanted else wanted


def select(snapshot: dict[str, Any], wanted: set[str] | None) -> dict[str, Any]:
    """The core keys, plus the sections `wanted` names (all of them for None), as LoadSnapshot.to_dict."""
    dropped = set(SECTION_KEYS.values()) if wanted is not None else set()
    if wanted is not None:
        dropped -= {SECTION_KEYS[name] for name in wanted if name in SECTION_KEYS}
    return {k: v for k, v in snapshot.items() if k not in dropped}


def legacy_load(s: Scheduler) -> dict[str, Any]:
    """One `/get_load` row (0.5.9's GetLoadReqOutput as FastAPI serialises it, the request-id fields of
    its base class included): the pool's used tokens plus the waiting requests' tokens. `dp_rank` is null,
    as a scheduler launched without data parallelism has none."""
    return {
        "rid": None,
        "http_worker_ipc": None,
        "dp_rank": None,
        "num_reqs": len(s.running.reqs) + len(s.waiting),
        "num_waiting_reqs": len(s.waiting),
        "num_tokens": pool_used(s) + sum(r.seqlen for r in s.waiting),
        "ts_tic": time.perf_counter(),
    }
