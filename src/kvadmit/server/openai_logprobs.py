"""OpenAI's logprobs, as SGLang 0.5.22 fills them from the engine's (logprob, token id, text) rows.

Chat (`logprobs: true`, `top_logprobs: N`): `{"content": [{"token", "bytes", "logprob", "top_logprobs":
[{"token", "bytes", "logprob"}, …]}, …]}`, one entry per output token. Completions (`logprobs: N`, the
log probability of each output token and of its N most likely alternatives): `{"text_offset": [-1, …],
"token_logprobs": […], "tokens": […], "top_logprobs": [{text: logprob, …}, …]}` (SGLang leaves text offsets
at -1, "not supported yet"). A stream carries each chunk's new tokens' entries. `bytes` and the completion
texts of tokens holding part of a character follow token_bytes.py.

A simulated server has no model and refuses these requests with a 400.
"""

from __future__ import annotations

from typing import Any

from kvadmit.server.errors import APIError
from kvadmit.server.token_bytes import lossless_text, token_bytes

SIMULATED = ("this server simulates its model (serve --simulate) and has no model to compute log "
             "probabilities from")  # fmt: skip


def chat_asked(logprobs: bool, top_logprobs: int | None, simulated: bool) -> tuple[bool, int]:
    """(return each token's log probability, how many alternatives) for a chat request."""
    if top_logprobs is not None and top_logprobs < 0:
        raise APIError(f"top_logprobs must be ≥ 0, got {top_logprobs}", param="top_logprobs")
    if not logprobs:
        return False, 0
    if simulated:
        raise APIError(f"logprobs: {SIMULATED}", param="logprobs")
    return True, top_logprobs or 0


def completion_asked(logprobs: int | None, simulated: bool) -> tuple[bool, int]:
    """The same for a completion request, whose `logprobs` is the number of alternatives."""
    if logprobs is None:
        return False, 0
    if logprobs < 0:
        raise APIError(f"logprobs must be ≥ 0, got {logprobs}", param="logprobs")
    if simulated:
        raise APIError(f"logprobs: {SIMULATED}", param="logprobs")
    return True, logprobs


def chat_logprobs(
    lps: list[float], tops: list[list[tuple[float, int]]] | None, ids: list[int], tokenizer: Any
) -> dict[str, Any]:
    def entry(lp: float, t: int) -> dict[str, Any]:
        text = tokenizer.decode([t])
        return {"token": text, "bytes": token_bytes(tokenizer, t, text), "logprob": lp}

    content = []
    for i, (lp, t) in enumerate(zip(lps, ids, strict=False)):
        alternatives = [entry(a, u) for a, u in tops[i]] if tops is not None and i < len(tops) else []
        content.append({**entry(lp, t), "top_logprobs": alternatives})
    return {"content": content}


def completion_logprobs(
    lps: list[float], tops: list[list[tuple[float, int]]] | None, ids: list[int], tokenizer: Any
) -> dict[str, Any]:
    def text(t: int) -> str:
        return lossless_text(tokenizer, t, tokenizer.decode([t]))

    n = min(len(lps), len(ids))
    return {
        "text_offset": [-1] * n,
        "token_logprobs": list(lps[:n]),
        "tokens": [text(t) for t in ids[:n]],
        "top_logprobs": [{text(u): a for a, u in row} for row in (tops or [])[:n]],
    }
