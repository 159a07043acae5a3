"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvadmit.request import SamplingLimits
from kvadmit.sampling_params import SamplingParams
from kvadmit.server.errors import APIError
from kvadmit.server.openai_logprobs import chat_asked, chat_logprobs, completion_asked, completion_logprobs
from kvadmit.server.protocol import ChatBody, CompletionBody, _OpenAIBody, sampling_from, stop_list
from kvadmit.server.request_path import Sampling, Submission, Usage, answer
from kvadmit.server.session import Delta, Outcome, Session
from kvadmit.server.sse import abort_event, sse
from kvadmit.server.state import ServerState


def _finish_reason(outcome: Outcome) -> str:
    return {"stop": "stop", "length": "length"}.get(outcome.finished.kind, "abort")


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _sampling(
    body: _OpenAIBody, max_new: int | None, max_field: str
) -> tuple[SamplingLimits, SamplingParams]:
    if body.n != 1:
        raise APIError(f"n must be 1 (one choice per request), got {body.n}", param="n")
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
        priority=body.priority,
        names={"max_new_tokens": max_field, "sampling_seed": "seed", "min_new_tokens": "min_tokens"},
        min_max_new_tokens=1,
    )


class OpenAIAnswer:
    """OpenAI's completion and chat completion objects; a stream sends each new piece of text as a chunk,
    then one with the finish reason (and, when asked, one with the usage). With stream_options'
    continuous_usage_stats, every chunk after the role's carries the usage so far, as SGLang's do."""

    def __init__(
        self, chat: bool, model: str, include_usage: bool, continuous_usage: bool = False,
        logprob_tokenizer: Any = None,
    ) -> None:  # fmt: skip
        self.chat = chat
        self.model = model
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.tokenizer = logprob_tokenizer  # given when the request asked for logprobs
        self.logprobs_sent = 0  # a stream's tokens whose logprobs went out
        self.created = int(time.time())
        self.rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex

    streams_rejections = False  # a stream rejected before its first token: its error response

    def refuses(self, outcome: Outcome) -> bool:
        return outcome.finished.kind == "abort"

    def aborted(self, session: Session, outcome: Outcome) -> list[bytes]:
        return [abort_event(outcome)]

    def body(self, sessions: list[Session], outcomes: list[Outcome]) -> Any:
        choices = []
        for i, o in enumerate(outcomes):
            choice: dict[str, Any] = {"index": i, "finish_reason": _finish_reason(o),
                                      "matched_stop": o.finished.matched}  # fmt: skip
            if self.chat:
                choice["message"] = {"role": "assistant", "content": o.text}
                if self.tokenizer is not None:
                    choice["logprobs"] = self._logprobs(o.logprobs, o.top_logprobs, o.output_ids, 0)
            else:
                choice["text"] = o.text
                choice["logprobs"] = self._logprobs(o.logprobs, o.top_logprobs, o.output_ids, 0)
            choices.append(choice)
        obj = "chat.completion" if self.chat else "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model,
                "choices": choices, "usage": _usage(Usage.of(outcomes))}  # fmt: skip

    def opening(self) -> list[bytes]:
        return [self._chunk(None, None, role=True)] if self.chat else []

    def delta(self, session: Session, delta: Delta) -> bytes | None:
        if not delta.text:
            return None
        so_far = Usage(len(session.input_ids), len(session.output_ids), session.cached_tokens)
        lps = self._new_logprobs(session.logprobs, session.top_logprobs, session.output_ids)
        return self._chunk(delta.text, None, usage=self._running(so_far), **lps)

    def closing(self, session: Session, outcome: Outcome) -> list[bytes]:
        out = []
        usage = Usage.of([outcome])
        lps = self._new_logprobs(outcome.logprobs, outcome.top_logprobs, outcome.output_ids)
        if outcome.final_delta:
            out.append(self._chunk(outcome.final_delta, None, usage=self._running(usage), **lps))
            lps = {}
        out.append(self._chunk(None if self.chat else "", _finish_reason(outcome), usage=self._running(usage),
                               matched_stop=outcome.finished.matched, **lps))  # fmt: skip
        if self.include_usage:
            out.append(self._sse(choices=[], usage=_usage(usage)))
        return out

    def _logprobs(
        self, lps: list[float] | None, tops: list[list[tuple[float, int]]] | None, ids: list[int], start: int
    ) -> dict[str, Any] | None:
        """The tokens' logprobs from `start` on, in this route's shape; None when not asked for."""
        if self.tokenizer is None or lps is None:
            return None
        build = chat_logprobs if self.chat else completion_logprobs
        return build(lps[start:], None if tops is None else tops[start:], ids[start:], self.tokenizer)

    def _new_logprobs(
        self, lps: list[float] | None, tops: list[list[tuple[float, int]]] | None, ids: list[int]
    ) -> dict[str, Any]:
        """A stream chunk's `logprobs`: the tokens' since the last chunk that carried some."""
        got = self._logprobs(lps, tops, ids, self.logprobs_sent)
        if got is None or lps is None:
            return {}
        self.logprobs_sent = len(lps)
        return {"logprobs": got}

    def _running(self, usage: Usage) -> dict[str, Any] | None:
        """A chunk's usage: the counts so far with continuous_usage_stats, else none."""
        return _usage(usage) if self.continuous_usage else None

    def _chunk(
        self,
        delta_text: str | None,
        finish: str | None,
        role: bool = False,
        usage: dict[str, Any] | None = None,
        **extra: Any,
    ) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if delta_text is not None and not role:
                delta["content"] = delta_text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, **extra}
        else:
            choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish,
                      **extra}  # fmt: skip
        return self._sse(choices=[choice]) if usage is None else self._sse(choices=[choice], usage=usage)

    def _sse(self, **fields: Any) -> bytes:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({"id": self.rid, "object": obj, "created": self.created, "model": self.model, **fields})


def _submission(
    state: ServerState, body: _OpenAIBody, prompts: list[list[int]], max_new: int | None, max_field: str
) -> Submission:
    """The checks every OpenAI generating route makes, in their order."""
    state.check_accepting()
    limits, params = _sampling(body, max_new, max_field)
    simulated = state.runner.backend.simulated
    if isinstance(body, ChatBody):
        return_logprob, top = chat_asked(body.logprobs, body.top_logprobs, simulated)
    else:
        return_logprob, top = completion_asked(getattr(body, "logprobs", None), simulated)
    stops = stop_list(body.stop, "stop")
    for ids in prompts:
        state.check_lengths(len(ids), max_new, max_field)
    if body.stream and len(prompts) != 1:
        raise APIError("streaming takes one prompt; send several without stream", param="prompt")
    sampling = Sampling(limits, params, stops, body.skip_special_tokens, return_logprob, return_logprob, top)
    return Submission(prompts, [sampling] * len(prompts), body.stream, [None] * len(prompts))


def router(state: ServerState) -> APIRouter:
    r = APIRouter()
    _models_route(r, state)
    _completion_routes(r, state)
    return r


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    """0.5.22's ModelCard: `owned_by` "sglang" (how smg tells an SGLang worker), `root` the served name."""
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
            "parent": None, "max_model_len": state.context_len}  # fmt: skip


def _models_route(r: APIRouter, state: ServerState) -> None:
    @r.get("/v1/models")
    async def models() -> dict[str, Any]:
        """0.5.22's `available_models`: a ModelList of the served model."""
        return {"object": "list", "data": [_model_card(state, state.served_model_name)]}

    @r.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> Response:
        """0.5.22's `retrieve_model`: the card, or a 404 with `code` "model_not_found"."""
        if model != state.served_model_name:
            error = {"message": f"The model '{model}' does not exist", "type": "invalid_request_error",
                     "param": "model", "code": "model_not_found"}  # fmt: skip
            return JSONResponse({"error": error}, status_code=404)
        return JSONResponse(_model_card(state, model))


def _completion_routes(r: APIRouter, state: ServerState) -> None:
    async def run(
        request: Request,
        body: _OpenAIBody,
        prompts: list[list[int]],
        max_new: int | None,
        max_field: str,
        chat: bool,
    ) -> Response:
        submission = _submission(state, body, prompts, max_new, max_field)
        options = body.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = bool(options and options.continuous_usage_stats)
        asked = submission.samplings[0].return_logprob
        form = OpenAIAnswer(chat, body.model or state.served_model_name, include_usage, continuous,
                            state.tokenizer if asked else None)  # fmt: skip
        return await answer(state, request, submission, form)

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
