"""Request bodies (their OpenAPI schema is generated from these models) and the checks beyond types:
ranges, lengths against the context and the pool. Every failure is an APIError naming the field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from kvadmit.memory.pool import ceil_page
from kvadmit.request import SamplingLimits
from kvadmit.sampling_params import SamplingError, SamplingParams
from kvadmit.scheduler.output_budget import (
    OutputBudgetError,
    check_requested_max_new_tokens,
    pool_room_for_output,
)
from kvadmit.server.errors import APIError

NATIVE_SAMPLING_KEYS = {
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos",
    "min_new_tokens", "sampling_seed", "skip_special_tokens", "n", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "no_stop_trim", "spaces_between_special_tokens",
    "stream_interval",
}  # fmt: skip


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, as SGLang's models do


class GenerateBody(_Body):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None  # a list: one per prompt
    stream: bool = False
    rid: str | list[str] | None = None  # a list: one per prompt
    return_logprob: bool | list[bool] = False  # a list: one per prompt
    return_text_in_logprobs: bool = False
    top_logprobs_num: int | list[int] = 0
    priority: Any = None  # an integer (checked by check_priority), one for every prompt


class StreamOptions(_Body):
    include_usage: bool = False  # a last chunk with the request's usage
    continuous_usage_stats: bool = False  # the usage so far on every chunk


class _OpenAIBody(_Body):
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    priority: Any = None  # an integer (checked by check_priority)


class CompletionBody(_OpenAIBody):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None  # each token's log probability and its N most likely alternatives'


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_OpenAIBody):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False  # each output token's log probability
    top_logprobs: int | None = None  # with logprobs: its N most likely alternatives'


class AbortBody(_Body):
    rid: str = ""
    abort_all: bool = False


# ----- checks ---------------------------------------------------------------------------------------
def stop_list(stop: Any, field: str) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise APIError(f"{field} must be a string or a list of strings", param=field)


PRIORITY_MIN, PRIORITY_MAX = -(1 << 63), (1 << 63) - 1  # SGLang's tokenizer takes a signed 64-bit int


def check_priority(value: Any) -> int | None:
    """The request's `priority`: absent or null, or an integer in SGLang's signed 64-bit range."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"priority must be an integer, got {value!r}", param="priority")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise APIError(
            "priority must be a signed 64-bit integer between -9223372036854775808 and 9223372036854775807",
            param="priority",
        )
    return value


def sampling_from(
    *,
    max_new_tokens: int | None,
    temperature: Any = 1.0,
    top_p: Any = 1.0,
    top_k: Any = -1,
    min_p: Any = 0.0,
    seed: Any = None,
    ignore_eos: Any = False,
    min_new_tokens: Any = 0,
    stop_token_ids: Any = None,
    priority: Any = None,
    names: dict[str, str] | None = None,
    min_max_new_tokens: int = 0,
) -> tuple[SamplingLimits, SamplingParams]:
    """Sampling limits and parameters, each checked; `names` maps a parameter to the field the client
    used (max_tokens for max_new_tokens, …) so the error names what the client wrote; max_new_tokens must
    be at least `min_max_new_tokens` (0 on the native API, 1 for OpenAI's max_tokens)."""
    names = names or {}

    def number(value: Any, key: str, kind: type) -> Any:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (kind is int and not float(value).is_integer())
        ):
            raise APIError(f"{names.get(key, key)} must be {'an integer' if kind is int else 'a number'}, "
                           f"got {value!r}", param=names.get(key, key))  # fmt: skip
        return kind(value)

    max_field = names.get("max_new_tokens", "max_new_tokens")
    try:
        max_new_tokens = check_requested_max_new_tokens(max_new_tokens, max_field, min_max_new_tokens)
    except OutputBudgetError as e:
        raise APIError(str(e), param=max_field) from None
    if seed is not None:
        seed = number(seed, "sampling_seed", int)
    if stop_token_ids is not None and not (
        isinstance(stop_token_ids, list) and all(isinstance(t, int) for t in stop_token_ids)
    ):
        raise APIError("stop_token_ids must be a list of integers", param="stop_token_ids")
    min_new = number(min_new_tokens, "min_new_tokens", int)
    if min_new < 0:
        raise APIError(f"{names.get('min_new_tokens', 'min_new_tokens')} must be ≥ 0, got {min_new}",
                       param=names.get("min_new_tokens", "min_new_tokens"))  # fmt: skip
    try:
        params = SamplingParams(
            temperature=number(temperature, "temperature", float),
            top_p=number(top_p, "top_p", float),
            top_k=number(top_k, "top_k", int),
            min_p=number(min_p, "min_p", float),
            seed=seed,
        )
    except SamplingError as e:
        raise APIError(str(e), param=str(e).split()[0]) from None
    if not isinstance(ignore_eos, bool):
        raise APIError(f"ignore_eos must be true or false, got {ignore_eos!r}", param="ignore_eos")
    limits = SamplingLimits(
        requested_max_new_tokens=max_new_tokens,  # None: up to the context
        ignore_eos=ignore_eos,
        min_new_tokens=min_new,
        stop_token_ids=frozenset(stop_token_ids or ()),
        priority=check_priority(priority),
    )
    return limits, params


def check_lengths(
    input_len: int, max_new: int | None, *, context_len: int, pool: int, page: int, field: str
) -> None:
    """A prompt must fit the context; an explicit output budget must fit beside it in the context and,
    with one page to spare, in the KV pool (else the request could never be admitted)."""
    if input_len == 0:
        raise APIError("the prompt is empty: a request needs at least one prompt token", param="prompt")
    if input_len >= context_len:
        raise APIError(
            f"The input ({input_len} tokens) is longer than the model's context length ({context_len} "
            "tokens).",
            param="prompt",
        )
    if max_new is None:
        return
    if input_len + max_new >= context_len:
        raise APIError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {input_len + max_new} tokens: {input_len} tokens from the input "
            f"messages and {max_new} tokens for the completion. Please reduce the number of tokens in the "
            "input messages or the completion to fit within the limit.",
            param=field,
        )
    most = pool_room_for_output(input_len, pool, page)
    if max_new > most:
        ceil_input = ceil_page(input_len, page)
        need = ceil_input + max_new + page
        paged = f" ({ceil_input} in pages of {page})" if ceil_input != input_len else ""
        raise APIError(
            f"The request can never fit the KV pool: prompt {input_len} tokens{paged} + {field} {max_new} + "
            f"one page ({page}) = {need} tokens, but the pool holds {pool} tokens. Ask for at most "
            f"{max(most, 0)} tokens, or start the server with a larger --max-total-tokens.",
            param=field,
        )
