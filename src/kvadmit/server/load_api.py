"""The load endpoints routers poll: `/v1/loads` (0.5.22's `entrypoints/v1_loads.py`, polled by smg) and
`/get_load` (the array of per-DP-rank rows sglang-router 0.3.x reads; 0.5.22 dropped it, kvadmit keeps
0.5.9's shape so that router still sees a load)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from kvadmit.observe.load_snapshot import load_snapshot
from kvadmit.server.errors import APIError
from kvadmit.server.load import legacy_load, sections, select
from kvadmit.server.state import ServerState

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
SECTION_PREFIX = {"speculative": "spec", "disaggregation": "disagg"}


def prometheus_loads(loads: list[dict[str, Any]]) -> str:
    """`format=prometheus`: one gauge per numeric field, `sglang_<field>` for a core field and
    `sglang_<section>_<field>` inside a section, labelled with the DP rank (0.5.22's
    _format_loads_prometheus)."""
    samples: dict[str, list[tuple[int, Any]]] = {}
    for load in loads:
        load = dict(load)
        rank = load.pop("dp_rank")
        for key, value in load.items():
            if isinstance(value, dict):
                prefix = SECTION_PREFIX.get(key, key)
                for sub, sub_value in value.items():
                    if isinstance(sub_value, (int, float)):
                        samples.setdefault(f"sglang_{prefix}_{sub}", []).append((rank, sub_value))
            elif isinstance(value, (int, float)):
                samples.setdefault(f"sglang_{key}", []).append((rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f'{name}{{dp_rank="{rank}"}} {value}' for rank, value in values)
    return "\n".join(lines) + "\n"


def router(state: ServerState) -> APIRouter:
    r = APIRouter()
    scheduler = state.runner.scheduler

    async def get_load() -> list[dict[str, Any]]:
        """0.5.9's `GET /get_load` (`tokenizer_manager.get_load`): one row per DP rank."""
        return [await state.engine_call(lambda: legacy_load(scheduler))]

    async def get_loads(
        dp_rank: int | None = None, include: str | None = None, format: str | None = None
    ) -> Any:
        """0.5.22's `GET /v1/loads` (`v1_loads.get_loads`). An unknown section is a 400 with SGLang's
        message (0.5.22 raises it past its handler's try, a 500)."""
        try:
            wanted = sections(include)
        except ValueError as e:
            raise APIError(str(e), 400, "include") from None
        snapshot = await state.engine_call(lambda: load_snapshot(scheduler, state.load))
        loads = [select(snapshot, wanted)] if dp_rank in (None, 0) else []
        if format == "prometheus":
            return Response(prometheus_loads(loads), media_type=PROMETHEUS_TEXT)
        return {
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "version": state.runner.args.sglang_version,
            "accelerator": state.accelerator,
            "num_accelerators": 1,  # tp_size × pp_size behind the one DP rank
            "loads": loads,
        }

    r.add_api_route("/get_load", get_load, methods=["GET"])
    r.add_api_route("/v1/loads", get_loads, methods=["GET"])
    return r
