"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvadmit.request import SamplingLimits
from kvadmit.sampling_params import SamplingParams
from kvadmit.server.errors import APIError
from kvadmit.server.protocol import ChatBody, CompletionBody, _OpenAIBody, sampling_from, stop_list
from kvadmit.server.session import Delta, Outcome, Session
from kvadmit.server.sse import DONE, abort_event, first_event, sse, stream_response
from kvadmit.server.state import ServerState


def _finish_reason(outcome: Outcome) -> str:
    return {"stop": "stop", "length": "length"}.get(outcome.finished.kind, "abort")


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _sampling(
    body: _OpenAIBody, max_new: int | None, max_field: str
) -> tuple[SamplingLimits, SamplingParams]:
    if body.n != 1:
        raise APIError(f"n must be 1 (one choice per request), got {body.n}", param="n")
    if max_new is not None and max_new <= 0:
        raise APIError(f"{max_field} must be at least 1, got {max_new}", param=max_field)
    return sampling_from(
        max_new_tokens=max_new,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=-1 if body.top_k is None else body.top_k,
        min_p=0.0 if body.min_p is None else body.min_p,
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        min_new_tokens=body.min_tokens,
        stop_token_ids=body.stop_token_ids,
        names={"max_new_tokens": max_field, "sampling_seed": "seed", "min_new_tokens": "min_tokens"},
    )


def router(state: ServerState) -> APIRouter:
    r = APIRouter()

    def check_model(body: _OpenAIBody) -> str:
        return body.model or state.served_model_name

    @r.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": state.served_model_name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "kvadmit",
                    "root": state.runner.backend.model_path,
                    "max_model_len": state.context_len,
                }
            ],
        }

    async def run(
        request: Request,
        body: _OpenAIBody,
        prompts: list[list[int]],
        max_new: int | None,
        max_field: str,
        chat: bool,
    ) -> Response:
        state.check_accepting()
        limits, params = _sampling(body, max_new, max_field)
        stops = stop_list(body.stop, "stop")
        for ids in prompts:
            state.check_lengths(len(ids), max_new, max_field)
        model = check_model(body)
        created = int(time.time())
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"

        def session(ids: list[int]) -> Session:
            return Session(
                state.runner, ids, dataclasses.replace(limits), params, stops=stops,
                skip_special_tokens=body.skip_special_tokens, streaming=body.stream,
                is_disconnected=request.is_disconnected, received=getattr(request.state, "received", None),
            )  # fmt: skip

        if not body.stream:
            sessions = [session(ids) for ids in prompts]
            outcomes = await asyncio.gather(*(s.result() for s in sessions))
            for o in outcomes:
                if o.finished.kind == "abort":
                    raise APIError(o.finished.message, o.finished.status_code)
            choices = []
            for i, o in enumerate(outcomes):
                choice: dict[str, Any] = {"index": i, "finish_reason": _finish_reason(o),
                                          "matched_stop": o.finished.matched}  # fmt: skip
                if chat:
                    choice["message"] = {"role": "assistant", "content": o.text}
                else:
                    choice["text"] = o.text
                    choice["logprobs"] = None
                choices.append(choice)
            usage = _usage(
                sum(o.finished.prompt_tokens for o in outcomes),
                sum(o.finished.completion_tokens for o in outcomes),
                sum(o.finished.cached_tokens for o in outcomes),
            )
            return JSONResponse(
                {"id": rid, "object": obj, "created": created, "model": model, "choices": choices,
                 "usage": usage}
            )  # fmt: skip

        if len(prompts) != 1:
            raise APIError("streaming takes one prompt; send several without stream", param="prompt")
        s = session(prompts[0])
        events, first = await first_event(s)
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunk(delta_text: str | None, finish: str | None, role: bool = False, **extra: Any) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
                if delta_text is not None and not role:
                    delta["content"] = delta_text
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, **extra}
            else:
                choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish,
                          **extra}  # fmt: skip
            return sse({"id": rid, "object": chunk_obj, "created": created, "model": model,
                        "choices": [choice]})  # fmt: skip

        async def body_stream() -> AsyncIterator[bytes]:
            if chat:
                yield chunk(None, None, role=True)
            item = first
            while item is not None:
                if isinstance(item, Delta):
                    if item.text:
                        yield chunk(item.text, None)
                else:
                    if item.finished.kind == "abort":
                        yield abort_event(item)
                    else:
                        if item.final_delta:
                            yield chunk(item.final_delta, None)
                        yield chunk(None if chat else "", _finish_reason(item),
                                    matched_stop=item.finished.matched)  # fmt: skip
                        if include_usage:
                            f = item.finished
                            yield sse({"id": rid, "object": chunk_obj, "created": created, "model": model,
                                       "choices": [], "usage": _usage(f.prompt_tokens, f.completion_tokens,
                                                                      f.cached_tokens)})  # fmt: skip
                    break
                item = await anext(events, None)
            yield DONE

        return stream_response(body_stream(), s)

    @r.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Response:
        p = body.prompt
        if isinstance(p, str):
            prompts = [await state.encode(p)]
        elif p and all(isinstance(x, str) for x in p):
            prompts = [await state.encode(x) for x in p]  # type: ignore[arg-type]
        elif p and all(isinstance(x, int) for x in p):
            prompts = [list(p)]  # type: ignore[arg-type]
        elif p and all(isinstance(x, list) for x in p):
            prompts = [list(x) for x in p]  # type: ignore[union-attr]
        else:
            raise APIError("prompt must be a string, a list of strings, or token ids", param="prompt")
        return await run(request, body, prompts, body.max_tokens, "max_tokens", chat=False)

    @r.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request) -> Response:
        if not body.messages:
            raise APIError("messages must not be empty", param="messages")
        messages = []
        for i, m in enumerate(body.messages):
            content = m.content
            if isinstance(content, list):
                texts = []
                for part in content:
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        raise APIError(f"messages[{i}].content: only text parts are supported",
                                       param=f"messages[{i}].content")  # fmt: skip
                    texts.append(part["text"])
                content = "".join(texts)
            messages.append({"role": m.role, "content": content or ""})
        try:
            text = state.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # a template that rejects the conversation (roles out of order, …)
            raise APIError(f"messages do not fit the model's chat template: {e}", param="messages") from None
        ids = await state.encode(text, add_special_tokens=False)
        field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        max_new = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        return await run(request, body, [ids], max_new, field, chat=True)

    return r
