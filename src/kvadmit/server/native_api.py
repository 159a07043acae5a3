"""SGLang's native endpoints: /generate, health, server and model info, flush_cache, abort_request,
/metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import kvadmit
from kvadmit.request import SamplingLimits
from kvadmit.sampling_params import SamplingParams
from kvadmit.server.errors import APIError
from kvadmit.server.protocol import NATIVE_SAMPLING_KEYS, AbortBody, GenerateBody, sampling_from, stop_list
from kvadmit.server.session import Delta, Outcome, Session
from kvadmit.server.sse import DONE, abort_event, first_event, sse, stream_response
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
    max_new = sp.get("max_new_tokens", 128)
    if max_new is not None and isinstance(max_new, int) and not isinstance(max_new, bool) and max_new < 0:
        raise APIError(f"max_new_tokens must be ≥ 0, got {max_new}", param="max_new_tokens")
    limits, params = sampling_from(
        max_new_tokens=max_new,
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


def router(state: ServerState) -> APIRouter:
    r = APIRouter()

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

    def response_of(outcome: Outcome, rid: str) -> dict[str, Any]:
        f = outcome.finished
        return {
            "text": outcome.text,
            "output_ids": outcome.output_ids,
            "meta_info": {
                "id": rid,
                "finish_reason": finish_reason(outcome),
                "prompt_tokens": f.prompt_tokens,
                "completion_tokens": f.completion_tokens,
                "cached_tokens": f.cached_tokens,
                "e2e_latency": outcome.e2e_latency,
            },
        }

    async def generate(body: GenerateBody, request: Request) -> Response:
        state.check_accepting()
        prompts, single = await prompts_of(body)
        sps = body.sampling_params or {}
        limits, params, stops, skip = native_sampling(sps)
        if body.stream and not single:
            raise APIError("streaming takes one prompt; send a batch without stream", param="stream")
        for ids in prompts:
            state.check_lengths(len(ids), limits.requested_max_new_tokens, "max_new_tokens")

        def session(ids: list[int], rid: str | None) -> Session:
            return Session(
                state.runner, ids, dataclasses.replace(limits),
                params, stops=stops, skip_special_tokens=skip, streaming=body.stream,
                is_disconnected=request.is_disconnected, rid=rid,
                received=getattr(request.state, "received", None),
            )  # fmt: skip

        if not body.stream:
            sessions = [session(ids, body.rid if single else None) for ids in prompts]
            outcomes = await asyncio.gather(*(s.result() for s in sessions))
            for o in outcomes:
                if o.finished.kind == "abort" and not o.output_ids:
                    raise APIError(o.finished.message, o.finished.status_code)
            out = [response_of(o, s.rid) for o, s in zip(outcomes, sessions, strict=True)]
            return JSONResponse(out[0] if single else out)

        s = session(prompts[0], body.rid)
        events, first = await first_event(s)

        async def body_stream() -> AsyncIterator[bytes]:
            text = ""
            item = first
            while item is not None:
                if isinstance(item, Delta):
                    text += item.text
                    yield sse({
                        "text": text, "output_ids": list(s.output_ids),
                        "meta_info": {"id": s.rid, "finish_reason": None,
                                      "prompt_tokens": len(s.input_ids),
                                      "completion_tokens": len(s.output_ids), "cached_tokens": 0},
                    })  # fmt: skip
                else:
                    if item.finished.kind == "abort":
                        yield abort_event(item)
                    else:
                        item_resp = response_of(item, s.rid)
                        yield sse(item_resp)
                    break
                item = await anext(events, None)
            yield DONE

        return stream_response(body_stream(), s)

    r.add_api_route("/generate", generate, methods=["POST"])
    r.add_api_route("/generate", generate, methods=["PUT"], include_in_schema=False)

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

    async def server_info() -> dict[str, Any]:
        internal = await state.engine_call(state.runner.internal_state)
        return {
            **state.server_args,
            "internal_states": [internal],
            "version": kvadmit.__version__,
            "sglang_version": state.runner.args.sglang_version,
        }

    r.add_api_route("/server_info", server_info, methods=["GET"])
    r.add_api_route("/get_server_info", server_info, methods=["GET"])

    async def model_info() -> dict[str, Any]:
        b = state.runner.backend
        return {
            "model_path": b.model_path,
            "tokenizer_path": b.tokenizer_path,
            "is_generation": True,
            "served_model_name": state.served_model_name,
            "context_len": state.context_len,
        }

    r.add_api_route("/model_info", model_info, methods=["GET"])
    r.add_api_route("/get_model_info", model_info, methods=["GET"])

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

    @r.get("/metrics")
    async def metrics() -> Response:
        if not state.enable_metrics or state.runner.metrics is None:
            raise APIError("metrics are off: start the server with --enable-metrics", 404)
        return Response(state.runner.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return r
