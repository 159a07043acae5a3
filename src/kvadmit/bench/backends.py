"""What each bench_serving backend sends, and how its answer is read back (docs/sglang-rules.md §7).

Three wire formats: SGLang's native /generate (cumulative text and meta_info in every chunk), OpenAI
completions and OpenAI chat completions (text deltas). The readers are pure: the caller hands each line
its arrival time, so the timing rules can be checked on hand-made timestamps.

Timing, as bench_serving 0.5.x measures it:
* TTFT: from sending to the first chunk whose text is non-empty.
* ITL, native: after the first chunk, each chunk that brings n > 0 new tokens (by meta_info's
  completion_tokens) adds n gaps of (its time − the previous counted chunk's time) / n. A chunk with no
  new token is skipped and does not move the previous time.
* ITL, OpenAI: each later chunk with non-empty text adds one gap, however many tokens it carries.
* Latency: from sending to the last non-empty line received (`data: [DONE]` included).
* Output tokens: the server's count (meta_info's completion_tokens, or the usage chunk OpenAI-style
  streams end with when asked); the requested budget only when the server reports none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Api = Literal["native", "completions", "chat"]


@dataclass(frozen=True, slots=True)
class BackendSpec:
    name: str
    path: str  # the endpoint under the base URL
    api: Api
    default_port: int


BACKENDS: dict[str, BackendSpec] = {
    b.name: b
    for b in (
        BackendSpec("sglang", "/generate", "native", 30000),
        BackendSpec("sglang-native", "/generate", "native", 30000),
        BackendSpec("sglang-oai", "/v1/completions", "completions", 30000),
        BackendSpec("sglang-oai-chat", "/v1/chat/completions", "chat", 30000),
        BackendSpec("vllm", "/v1/completions", "completions", 8000),
        BackendSpec("vllm-chat", "/v1/chat/completions", "chat", 8000),
    )
}


@dataclass(frozen=True, slots=True)
class PayloadOptions:
    model: str
    stream: bool = True
    ignore_eos: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # --extra-request-body, merged last (top level)


def build_payload(api: Api, prompt: str | list[int], output_len: int, opts: PayloadOptions) -> dict[str, Any]:
    """The request body bench_serving sends: temperature 0, the dataset's output length as the token
    budget, ignore_eos inside sampling_params (native) or at the top level (OpenAI-style).

    OpenAI-style streams also ask for a final usage chunk (`stream_options.include_usage`), so output
    token counts come from the server even when a request stops early."""
    if api == "native":
        payload: dict[str, Any] = {
            ("text" if isinstance(prompt, str) else "input_ids"): prompt,
            "sampling_params": {
                "temperature": 0.0,
                "max_new_tokens": output_len,
                "ignore_eos": opts.ignore_eos,
            },
            "stream": opts.stream,
            "return_logprob": False,
            "logprob_start_len": -1,
        }
    elif api == "completions":
        payload = {"model": opts.model, "prompt": prompt, "best_of": 1, "max_tokens": output_len}
    else:
        if not isinstance(prompt, str):
            raise ValueError("the chat backends send text prompts, not token ids")
        payload = {
            "model": opts.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_completion_tokens": output_len,
        }
    if api != "native":
        payload.update(stream=opts.stream, temperature=0.0, ignore_eos=opts.ignore_eos)
        if opts.stream:
            payload["stream_options"] = {"include_usage": True}
    payload.update(opts.extra)
    return payload


def asked_limits(payload: dict[str, Any]) -> tuple[int, bool]:
    """(max_new_tokens, ignore_eos) as a payload asks for them, wherever the API puts them."""
    params = payload.get("sampling_params")
    where = params if isinstance(params, dict) else payload
    budget = 0
    for key in ("max_new_tokens", "max_completion_tokens", "max_tokens"):
        value = where.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            budget = value
            break
    return budget, bool(where.get("ignore_eos", False))


class StreamError(Exception):
    """The server reported an error inside a stream (an aborted request)."""


@dataclass(slots=True)
class StreamReader:
    """One response, read line by line (or as one JSON body when not streaming)."""

    api: Api
    sent: float  # perf_counter seconds when the request went out
    asked_output_len: int  # bench_serving's output count when the server reports none
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    text: str = ""
    output_len: int | None = None
    prompt_tokens: int | None = None  # as the server counted them
    cached_tokens: int | None = None
    latency: float = 0.0
    _last_time: float = 0.0
    _last_len: int = 0

    def line(self, raw: str, now: float) -> None:
        """One line of the body, received at `now`."""
        raw = raw.strip()
        if not raw:
            return
        self.latency = now - self.sent
        data = raw[len("data:") :].strip() if raw.startswith("data:") else raw
        if data == "[DONE]":
            return
        obj = json.loads(data)
        if not isinstance(obj, dict):
            raise StreamError(f"unexpected chunk: {data[:200]}")
        if "error" in obj and "choices" not in obj and "text" not in obj:
            err = obj["error"]
            raise StreamError(str(err.get("message", err) if isinstance(err, dict) else err))
        if self.api == "native":
            self._native(obj, now)
        else:
            self._openai(obj, now)

    def _native(self, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("meta_info") or {}
        self._usage(meta.get("prompt_tokens"), meta.get("cached_tokens"))
        if meta.get("completion_tokens") is not None:
            # The server's count, from every chunk: bench_serving reads it only from chunks with text,
            # so a request whose output decodes to no text would count as its budget there.
            self.output_len = int(meta["completion_tokens"])
        text = obj.get("text")
        if not text:
            return
        self.text = text  # cumulative
        count = self.output_len if self.output_len is not None else self._last_len
        if self.ttft is None:
            self.ttft = now - self.sent
        else:
            new = count - self._last_len
            if new == 0:
                return
            self.itl.extend([(now - self._last_time) / new] * new)
        self._last_time = now
        self._last_len = count

    def _openai(self, obj: dict[str, Any], now: float) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if usage.get("completion_tokens") is not None:
                self.output_len = int(usage["completion_tokens"])
            details = usage.get("prompt_tokens_details") or {}
            self._usage(usage.get("prompt_tokens"), details.get("cached_tokens"))
        choices = obj.get("choices") or [{}]
        choice = choices[0]
        if self.api == "completions":
            piece = choice.get("text") or ""
        else:
            message = choice.get("delta") or choice.get("message") or {}
            piece = message.get("content") or ""
        if not piece:
            return
        if self.ttft is None:
            self.ttft = now - self.sent
        else:
            self.itl.append(now - self._last_time)
        self._last_time = now
        self.text += piece

    def _usage(self, prompt: Any, cached: Any) -> None:
        if prompt is not None:
            self.prompt_tokens = int(prompt)
        if cached is not None:
            self.cached_tokens = int(cached)

    def body(self, raw: str, now: float) -> None:
        """A whole non-streamed answer: TTFT is the latency, and there are no gaps."""
        self.line(raw, now)
        self.itl.clear()
        self.ttft = self.latency

    @property
    def completion_tokens(self) -> int:
        return self.output_len if self.output_len is not None else self.asked_output_len
