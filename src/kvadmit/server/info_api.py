"""Server information and the profiler switches, in SGLang 0.5.22's shapes (`entrypoints/http_server.py`):
`/server_info` (and its deprecated alias `/get_server_info`), `/start_profile`, `/stop_profile`, and the
root `/`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

import kvadmit
from kvadmit.server.state import ServerState

NO_PROFILE = "kvadmit's engine records no torch profile: nothing is written."


def server_info_body(state: ServerState, internal: dict[str, Any]) -> dict[str, Any]:
    """0.5.22's `server_info`: the resolved server arguments with `launch_command` and the scheduler's
    start-up info (`build_server_info`), `startup_time`, one internal state per DP rank (the resolved
    arguments again with the scheduler's live numbers, as `SchedulerInternalStateController` returns
    them), `version` (the SGLang release whose API and decisions this server follows) and `frontend`.
    kvadmit adds `kvadmit_version` and keeps `sglang_version`."""
    startup = state.scheduler_info.get("startup_time")
    return {
        **state.server_args,
        **state.scheduler_info,
        "kv_events": None,  # no KV-event publisher
        "startup_time": startup,
        "internal_states": [{**state.server_args, **internal}],
        "version": state.runner.args.sglang_version,
        "frontend": "python",
        "kvadmit_version": kvadmit.__version__,
        "sglang_version": state.runner.args.sglang_version,
    }


def router(state: ServerState) -> APIRouter:
    r = APIRouter()
    runner = state.runner

    def internal() -> dict[str, Any]:  # engine thread
        s = runner.scheduler
        return {
            "world_size": 1,  # tp_size × pp_size × dp_size
            "startup_time": state.scheduler_info.get("startup_time"),
            "effective_max_running_requests_per_dp": s.max_running_requests,
            "last_gen_throughput": state.load.last_gen_throughput,
            **runner.internal_state(),
        }

    async def server_info() -> dict[str, Any]:
        """0.5.22's `GET /server_info` and `GET /get_server_info`."""
        return server_info_body(state, await state.engine_call(internal))

    r.add_api_route("/server_info", server_info, methods=["GET"])
    r.add_api_route("/get_server_info", server_info, methods=["GET"])

    async def start_profile() -> Response:
        """0.5.22's `start_profile_async` (GET or POST, an optional ProfileReq body): 200 "Start
        profiling."; kvadmit accepts it and says that no profile is recorded."""
        return PlainTextResponse(f"Start profiling. {NO_PROFILE}\n", status_code=200)

    async def stop_profile() -> Response:
        """0.5.22's `stop_profile_async`: 200 "Stop profiling. ..."; here there is nothing to stop."""
        return PlainTextResponse(f"Stop profiling. {NO_PROFILE}\n", status_code=200)

    for path, handler in (("/start_profile", start_profile), ("/stop_profile", stop_profile)):
        r.add_api_route(path, handler, methods=["POST"])
        r.add_api_route(path, handler, methods=["GET"], include_in_schema=False)

    async def root() -> str:
        """0.5.22's `sglang_root` (GET and HEAD `/`): a JSON string saying the server runs."""
        return f"kvadmit is running (SGLang {runner.args.sglang_version}'s API)"

    r.add_api_route("/", root, methods=["GET"])
    r.add_api_route("/", root, methods=["HEAD"], include_in_schema=False)
    return r
