"""SGLang's native endpoints: /generate, health, model info, flush_cache, abort_request, /metrics
(server info and the profiler switches are in info_api.py, the loads in load_api.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from kvadmit.server.errors import APIError
from kvadmit.server.native_answer import NativeAnswer
from kvadmit.server.protocol import (
    NATIVE_SAMPLING_KEYS,
    AbortBody,
    GenerateBody,
    check_priority,
    sampling_from,
    stop_list,
)
from kvadmit.server.request_path import Sampling, Submission, answer
from kvadmit.server.session import Session
from kvadmit.server.state import ServerState

UNSUPPORTED_NONZERO = ("frequency_penalty", "presence_penalty")


def native_sampling(sp: dict[str, Any]) -> Sampling:
    if not isinstance(sp, dict):
        raise APIError("sampling_params must be an object, or a list of one per prompt",
                       param="sampling_params")  # fmt: skip
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
    interval = sp.get("stream_interval")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 0):
        raise APIError("sampling_params.stream_interval must be a whole number ≥ 0",
                       param="sampling_params.stream_interval")  # fmt: skip
    return Sampling(limits, params, stop_list(sp.get("stop"), "stop"), skip, stream_interval=interval)


def per_prompt_sampling(sp: dict[str, Any] | list[dict[str, Any]] | None, n: int) -> list[Sampling]:
    """SGLang's batch forms: one object for every prompt, or a list of one per prompt."""
    if not isinstance(sp, list):
        return [native_sampling(sp or {})] * n
    if len(sp) != n:
        raise APIError(f"sampling_params has {len(sp)} entries for {n} prompt(s): give one per prompt, "
                       "or one object for all", param="sampling_params")  # fmt: skip
    return [native_sampling(x) for x in sp]


def per_prompt_rids(rid: str | list[str] | None, n: int, single: bool) -> list[str | None]:
    """SGLang's rids: none (fresh ids), a list of one per prompt, or one string (in a batch, prompt i gets
    `{rid}_{i}`)."""
    if rid is None:
        return [None] * n
    if isinstance(rid, str):
        return [rid] if single else [f"{rid}_{i}" for i in range(n)]
    if len(rid) != n:
        raise APIError(f"rid has {len(rid)} entries for {n} prompt(s): give one per prompt", param="rid")
    if len(set(rid)) != n:
        raise APIError("rid: each prompt of a batch needs its own rid", param="rid")
    return list(rid)


def with_logprobs(state: ServerState, body: GenerateBody, samplings: list[Sampling]) -> list[Sampling]:
    """return_logprob (one for all prompts or one per prompt): each output token's log probability, from
    the model's logits; never silently left out."""
    n, asked = len(samplings), body.return_logprob
    wanted = asked if isinstance(asked, list) else [asked] * n
    if len(wanted) != n:
        raise APIError(f"return_logprob has {len(wanted)} entries for {n} prompt(s)", param="return_logprob")
    if not any(wanted):
        return samplings
    if state.runner.backend.simulated:
        raise APIError("return_logprob: this server simulates its model (serve --simulate) and has no model "
                       "to compute log probabilities from", param="return_logprob")  # fmt: skip
    asked_top = body.top_logprobs_num
    tops = asked_top if isinstance(asked_top, list) else [asked_top] * n
    if len(tops) != n or any(t < 0 for t in tops):
        raise APIError(f"top_logprobs_num must be ≥ 0, one for all prompts or one per prompt ({n})",
                       param="top_logprobs_num")  # fmt: skip
    texts = body.return_text_in_logprobs
    return [replace(s, return_logprob=w, text_in_logprobs=texts, top_logprobs_num=t if w else 0)
            for s, w, t in zip(samplings, wanted, tops, strict=True)]  # fmt: skip


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
            if not texts:
                raise APIError("text is an empty list: no prompt to generate from; give a string or a "
                               "non-empty list of strings", param="text")  # fmt: skip
            return [await state.encode(t) for t in texts], isinstance(body.text, str)
        ids = body.input_ids or []
        if not ids:
            raise APIError("input_ids is empty: no prompt to generate from; give a list of token ids or a "
                           "non-empty list of such lists", param="input_ids")  # fmt: skip
        if ids and isinstance(ids[0], list):
            return [list(x) for x in ids], False  # type: ignore[arg-type]
        return [list(ids)], True  # type: ignore[arg-type]

    async def generate(body: GenerateBody, request: Request) -> Response:
        state.check_accepting()
        prompts, single = await prompts_of(body)
        samplings = per_prompt_sampling(body.sampling_params, len(prompts))
        samplings = with_logprobs(state, body, samplings)
        priority = check_priority(body.priority)
        if priority is not None:  # one for every prompt, as SGLang's GenerateReqInput has it
            samplings = [replace(s, limits=replace(s.limits, priority=priority)) for s in samplings]
        for ids, sampling in zip(prompts, samplings, strict=True):
            state.check_lengths(len(ids), sampling.limits.requested_max_new_tokens, "max_new_tokens")
        rids = per_prompt_rids(body.rid, len(prompts), single)
        submission = Submission(prompts, samplings, body.stream, rids)
        form = NativeAnswer(single, state.tokenizer if body.return_text_in_logprobs else None)
        return await answer(state, request, submission, form)

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
