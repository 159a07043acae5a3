"""SGLang's native endpoints: /generate, health, model info, flush_cache, abort_request, /metrics
(server info and the profiler switches are in info_api.py, the loads in load_api.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from kvadmit.request import SamplingLimits
from kvadmit.sampling_params import SamplingParams
from kvadmit.server.errors import APIError
from kvadmit.server.protocol import NATIVE_SAMPLING_KEYS, AbortBody, GenerateBody, sampling_from, stop_list
from kvadmit.server.request_path import Submission, Usage, answer
from kvadmit.server.session import Delta, Outcome, Session
from kvadmit.server.sse import sse
from kvadmit.server.state import ServerState

UNSUPPORTED_NONZERO = ("frequency_penalty", "presence_penalty")


def finish_reason(outcome: Outcome) -> dict[str, Any]:
    f = outcome.finished
    if f.kind == "abort":
        return {"type": "abort", "message": f.message, "status_code": f.status_code}
    if f.kind == "length":
        return {"type": "length", "length": f.completion_tokens}
    return {"type": "stop", "matched": f.matched}


def native_sampling(sp: dict[str, Any]) -> tuple[SamplingLimits, SamplingParams, list[str], bool]:
    unknown = set(sp) - NATIVE_SAMPLING_KEYS
    if unknown:
        raise APIError(
            f"unknown sampling parameter(s) {sorted(unknown)}; allowed: {sorted(NATIVE_SAMPLING_KEYS)}",
            param="sampling_params",
        )
    if sp.get("n", 1) != 1:
        raise APIError(f"sampling_params.n must be 1, got {sp['n']!r}", param="sampling_params.n")
    for key in UNSUPPORTED_NONZERO:
        if sp.get(key, 0) not in (0, 0.0):
            raise APIError(f"sampling_params.{key} is not supported (only 0)", param=f"sampling_params.{key}")
    if sp.get("repetition_penalty", 1) not in (1, 1.0):
        raise APIError("sampling_params.repetition_penalty is not supported (only 1)",
                       param="sampling_params.repetition_penalty")  # fmt: skip
    limits, params = sampling_from(
        max_new_tokens=sp.get("max_new_tokens", 128),
        temperature=sp.get("temperature", 1.0),
        top_p=sp.get("top_p", 1.0),
        top_k=sp.get("top_k", -1),
        min_p=sp.get("min_p", 0.0),
        seed=sp.get("sampling_seed"),
        ignore_eos=sp.get("ignore_eos", False),
        min_new_tokens=sp.get("min_new_tokens", 0),
        stop_token_ids=sp.get("stop_token_ids"),
    )
    skip = sp.get("skip_special_tokens", True)
    if not isinstance(skip, bool):
        raise APIError("skip_special_tokens must be true or false", param="skip_special_tokens")
    return limits, params, stop_list(sp.get("stop"), "stop"), skip


class NativeAnswer:
    """SGLang's /generate answers: one object per prompt (a list for a batch); a stream sends the whole
    text so far in each event."""

    def __init__(self, single: bool) -> None:
        self.single = single
        self.text = ""  # the streamed text so far

    def refuses(self, outcome: Outcome) -> bool:
        return outcome.finished.kind == "abort" and not outcome.output_ids

    def body(self, sessions: list[Session], outcomes: list[Outcome]) -> Any:
        out = [response_of(o, s.rid) for o, s in zip(outcomes, sessions, strict=True)]
        return out[0] if self.single else out

    def opening(self) -> list[bytes]:
        return []

    def delta(self, session: Session, delta: Delta) -> bytes | None:
        self.text += delta.text
        return sse({
            "text": self.text, "output_ids": list(session.output_ids),
            "meta_info": {"id": session.rid, "finish_reason": None,
                          "prompt_tokens": len(session.input_ids),
                          "completion_tokens": len(session.output_ids), "cached_tokens": 0},
        })  # fmt: skip

    def closing(self, session: Session, outcome: Outcome) -> list[bytes]:
        return [sse(response_of(outcome, session.rid))]


def response_of(outcome: Outcome, rid: str) -> dict[str, Any]:
    usage = Usage.of([outcome])
    return {
        "text": outcome.text,
        "output_ids": outcome.output_ids,
        "meta_info": {
            "id": rid,
            "finish_reason": finish_reason(outcome),
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "e2e_latency": outcome.e2e_latency,
        },
    }


def router(state: ServerState) -> APIRouter:
    r = APIRouter()
    _generate_route(r, state)
    _health_routes(r, state)
    _info_routes(r, state)
    _control_routes(r, state)
    return r


def _generate_route(r: APIRouter, state: ServerState) -> None:
    async def prompts_of(body: GenerateBody) -> tuple[list[list[int]], bool]:
        if (body.text is None) == (body.input_ids is None):
            raise APIError("give exactly one of text or input_ids", param="text")
        if body.text is not None:
            texts = [body.text] if isinstance(body.text, str) else body.text
            return [await state.encode(t) for t in texts], isinstance(body.text, str)
        ids = body.input_ids or []
        if ids and isinstance(ids[0], list):
            return [list(x) for x in ids], False  # type: ignore[arg-type]
        return [list(ids)], True  # type: ignore[arg-type]

    async def generate(body: GenerateBody, request: Request) -> Response:
        state.check_accepting()
        prompts, single = await prompts_of(body)
        sps = body.sampling_params or {}
        limits, params, stops, skip = native_sampling(sps)
        if body.stream and not single:
            raise APIError("streaming takes one prompt; send a batch without stream", param="stream")
        for ids in prompts:
            state.check_lengths(len(ids), limits.requested_max_new_tokens, "max_new_tokens")
        rids = [body.rid] if single else [None] * len(prompts)
        submission = Submission(prompts, limits, params, stops, skip, body.stream, rids)
        return await answer(state, request, submission, NativeAnswer(single))

    r.add_api_route("/generate", generate, methods=["POST"])
    r.add_api_route("/generate", generate, methods=["PUT"], include_in_schema=False)


def _health_routes(r: APIRouter, state: ServerState) -> None:
    @r.api_route("/health", methods=["GET"])
    @r.api_route("/health_generate", methods=["GET"])
    async def health(request: Request) -> Response:
        if not state.runner.accepting:
            return PlainTextResponse("The server is shutting down.", status_code=503)
        ok, why = state.runner.healthy
        if not ok:
            return PlainTextResponse(why, status_code=503)
        if state.runner.engine.busy:
            return Response(status_code=200)  # ongoing requests carry health information
        limits, params = sampling_from(max_new_tokens=1, temperature=0.0)
        s = Session(state.runner, [1], limits, params, stops=[], skip_special_tokens=True,
                    streaming=False, is_disconnected=request.is_disconnected,
                    rid=f"HEALTH_CHECK_{time.time_ns()}")  # fmt: skip
        try:
            await asyncio.wait_for(s.result(), state.health_timeout)
        except (asyncio.TimeoutError, ConnectionAbortedError):
            return PlainTextResponse(f"no token generated within {state.health_timeout:g} s", status_code=503)
        return Response(status_code=200)

    @r.get("/ready")
    async def ready() -> Response:
        ok, _ = state.runner.healthy
        return Response(status_code=200 if ok and state.runner.accepting else 503)


def _info_routes(r: APIRouter, state: ServerState) -> None:
    async def model_info() -> dict[str, Any]:
        b = state.runner.backend
        return {
            "model_path": state.server_args["model_path"],  # serve --simulate: the served name
            "tokenizer_path": b.tokenizer_path,
            "is_generation": True,
            "served_model_name": state.served_model_name,
            "context_len": state.context_len,
        }

    r.add_api_route("/model_info", model_info, methods=["GET"])
    r.add_api_route("/get_model_info", model_info, methods=["GET"])


def _control_routes(r: APIRouter, state: ServerState) -> None:
    async def flush_cache() -> Response:
        if await state.engine_call(state.runner.flush_cache):
            return PlainTextResponse("Cache flushed.\n", status_code=200)
        return PlainTextResponse("Cache not flushed because there are pending requests.\n", status_code=400)

    r.add_api_route("/flush_cache", flush_cache, methods=["POST"])
    r.add_api_route("/flush_cache", flush_cache, methods=["GET"], include_in_schema=False)

    @r.post("/abort_request")
    async def abort_request(body: AbortBody) -> Response:
        if body.abort_all:
            rids = await state.engine_call(state.runner.live_rids)
            for rid in rids:
                state.runner.abort(rid)
        elif body.rid:
            state.runner.abort(body.rid)
        else:
            raise APIError("give rid, or abort_all: true", param="rid")
        return Response(status_code=200)

    async def metrics() -> Response:
        """SGLang mounts prometheus_client's ASGI app on /metrics, which answers HEAD too."""
        if not state.enable_metrics or state.runner.metrics is None:
            raise APIError("metrics are off: start the server with --enable-metrics", 404)
        return Response(state.runner.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    r.add_api_route("/metrics", metrics, methods=["GET"])
    r.add_api_route("/metrics", metrics, methods=["HEAD"], include_in_schema=False)
