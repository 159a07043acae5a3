"""How SGLang's /generate answers: one object per prompt (a list for a batch), `text`, `output_ids` and a
`meta_info` whose fields come in SGLang 0.5.22's order. A stream sends the whole text so far in each event,
and a stream the engine aborts ends with an ordinary chunk whose finish_reason says so. A streamed batch
interleaves its prompts' events, each with its prompt's `index` (last, as SGLang adds it)."""

from __future__ import annotations

import time
from typing import Any

from kvadmit.server.request_times import api_side
from kvadmit.server.session import Delta, Outcome, Session
from kvadmit.server.sse import sse

WEIGHT_VERSION = "default"  # SGLang's --weight-version default (the flag has no effect here)


def finish_reason(outcome: Outcome) -> dict[str, Any]:
    f = outcome.finished
    if f.kind == "abort":
        return {"type": "abort", "message": f.message, "status_code": f.status_code}
    if f.kind == "length":
        return {"type": "length", "length": f.completion_tokens}
    return {"type": "stop", "matched": f.matched}


def meta_info(
    rid: str,
    finish: dict[str, Any] | None,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    retractions: int,
    logprobs: dict[str, Any] | None = None,
    times: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields SGLang's tokenizer manager puts in every chunk. reasoning_tokens: 0 (no reasoning
    parser here); cached_tokens_details: where the cached prompt tokens came from, null when none were
    (one tier here: the device's radix cache); with --enable-metrics the scheduler's time stats."""
    details = {"device": cached_tokens, "host": 0} if cached_tokens > 0 else None
    return {
        "id": rid, "finish_reason": finish, "prompt_tokens": prompt_tokens, "weight_version": WEIGHT_VERSION,
        "num_retractions": retractions, **(times or {}), **(logprobs or {}), "reasoning_tokens": 0,
        "completion_tokens": completion_tokens, "cached_tokens": cached_tokens,
        "cached_tokens_details": details,
    }  # fmt: skip


def logprob_fields(
    logprobs: list[float] | None, tops: list[list[tuple[float, int]]] | None, ids: list[int], tokenizer: Any
) -> dict[str, Any] | None:
    """return_logprob's fields: output_token_logprobs as [logprob, token id, its text or null] (text with
    return_text_in_logprobs: a tokenizer given), and with top_logprobs_num a list of such per token; no
    input logprobs (SGLang's default logprob_start_len)."""
    if logprobs is None:
        return None

    def row(lp: float, t: int) -> list[Any]:
        return [lp, t, tokenizer.decode([t]) if tokenizer is not None else None]

    out = [row(lp, t) for lp, t in zip(logprobs, ids, strict=False)]  # equal lengths: sent together
    fields: dict[str, Any] = {
        "input_token_logprobs": [], "output_token_logprobs": out, "output_token_logprobs_length": len(out),
    }  # fmt: skip
    if tops is not None:
        fields["input_top_logprobs"] = []
        fields["output_top_logprobs"] = [[row(lp, t) for lp, t in step] for step in tops]
    return fields


def response_of(
    outcome: Outcome, rid: str, tokenizer: Any = None, first_sent: float | None = None
) -> dict[str, Any]:
    """A request's last answer. `first_sent`: when its first chunk went out (a stream), else None: this
    answer is its first, and says when it goes out (`response_sent_to_client_ts`, last, as SGLang adds it
    as it sends)."""
    f = outcome.finished
    lps = logprob_fields(outcome.logprobs, outcome.top_logprobs, outcome.output_ids, tokenizer)
    meta = meta_info(rid, finish_reason(outcome), f.prompt_tokens, f.completion_tokens, f.cached_tokens,
                     f.retractions, lps, outcome.times)  # fmt: skip
    meta["e2e_latency"] = outcome.e2e_latency
    if outcome.times is not None and outcome.wall is not None:  # --enable-metrics
        received, dispatched, first_output, ended = outcome.wall
        meta.update(api_side(received, dispatched, first_output, first_sent, ended, f.completion_tokens))
    if first_sent is None:
        meta["response_sent_to_client_ts"] = time.time()
    return {"text": outcome.text, "output_ids": outcome.output_ids, "meta_info": meta}


class NativeAnswer:
    """One /generate request's answers."""

    streams_rejections = True  # SGLang's stream has begun (status 200) before the scheduler sees it

    def __init__(self, single: bool, logprob_tokenizer: Any = None) -> None:
        self.single = single
        self.texts: dict[str, str] = {}  # rid → the text streamed so far
        self.tokenizer = logprob_tokenizer  # return_text_in_logprobs: what decodes each token's text
        self.first_sent: dict[str, float] = {}  # rid → when its first chunk went out

    def refuses(self, outcome: Outcome) -> bool:
        return outcome.finished.kind == "abort" and not outcome.output_ids

    def body(self, sessions: list[Session], outcomes: list[Outcome]) -> Any:
        out = [response_of(o, s.rid, self.tokenizer) for o, s in zip(outcomes, sessions, strict=True)]
        return out[0] if self.single else out

    def opening(self) -> list[bytes]:
        return []

    def delta(self, session: Session, delta: Delta) -> bytes | None:
        rid = session.rid
        text = self.texts[rid] = self.texts.get(rid, "") + delta.text
        lps = logprob_fields(session.logprobs, session.top_logprobs, session.output_ids, self.tokenizer)
        meta = meta_info(rid, None, len(session.input_ids), len(session.output_ids),
                         session.cached_tokens, session.retractions, lps, session.times)  # fmt: skip
        if rid not in self.first_sent:  # SGLang stamps the first chunk it sends
            self.first_sent[rid] = meta["response_sent_to_client_ts"] = time.time()
        return self._event({"text": text, "output_ids": list(session.output_ids), "meta_info": meta}, session)

    def closing(self, session: Session, outcome: Outcome) -> list[bytes]:
        first = self.first_sent.get(session.rid)
        return [self._event(response_of(outcome, session.rid, self.tokenizer, first), session)]

    def aborted(self, session: Session, outcome: Outcome) -> list[bytes]:
        return self.closing(session, outcome)

    def _event(self, obj: dict[str, Any], session: Session) -> bytes:
        if not self.single:
            obj["index"] = session.index
        return sse(obj)
