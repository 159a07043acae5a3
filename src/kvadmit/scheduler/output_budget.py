"""The output budget a request is granted on arrival (SGLang's init_req_max_new_tokens, docs/sglang-rules.md
§1.9).

A client asks for max_new_tokens, or for none (as many as the context allows). The scheduler grants the
least of: the ask; SGLANG_MAX_NEW_TOKENS_LIMIT when set; what the longest allowed sequence leaves after
the prompt; and what an empty pool leaves after the prompt in whole pages plus one page, so that an
accepted request can always be scheduled on an empty pool. Never below 0.

Pure arithmetic, shared by the scheduler (which grants), `kvadmit capacity` (which explains the cap) and
the server's length check (which rejects an explicit ask the pool can never hold).
"""

from __future__ import annotations

from kvadmit.memory.pool import ceil_page
from kvadmit.request import MAX_NEW_TOKENS_UNSET


class OutputBudgetError(ValueError):
    """A max_new_tokens that is not a whole number, or below what the API allows; the message names the
    field as the client wrote it."""


def check_requested_max_new_tokens(
    value: object, field: str = "max_new_tokens", minimum: int = 0
) -> int | None:
    """The client's ask, checked: None (up to the context) or a whole number ≥ `minimum` (0 on SGLang's
    native API and offline, 1 for the OpenAI API's max_tokens). An integral float (5.0) counts as 5."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
        raise OutputBudgetError(f"{field} must be an integer, got {value!r}")
    asked = int(value)
    if asked < minimum:
        bound = "≥ 0" if minimum == 0 else f"at least {minimum}"
        raise OutputBudgetError(f"{field} must be {bound}, got {asked}")
    return asked


def max_request_len(context_len: int, pool_size: int) -> int:
    """The longest sequence (prompt + outputs) a request may reach: SGLang's max_req_len."""
    return min(context_len - 1, pool_size - 1)


def pool_room_for_output(input_len: int, pool_size: int, page_size: int) -> int:
    """The largest max_new_tokens an empty pool holds beside this prompt: ceil_page(prompt) + max_new
    + one page must stay strictly below the pool size. Negative when the prompt alone does not fit."""
    return pool_size - ceil_page(input_len, page_size) - page_size - 1


def grant_max_new_tokens(
    requested: int | None,
    input_len: int,
    *,
    max_req_len: int,
    pool_size: int,
    page_size: int,
    limit: int | None = None,
) -> int:
    """The max_new_tokens a request of `input_len` prompt tokens is granted (`requested` None: unset;
    `limit`: SGLANG_MAX_NEW_TOKENS_LIMIT)."""
    granted = MAX_NEW_TOKENS_UNSET if requested is None else requested
    if limit is not None and granted > limit:
        granted = limit
    by_length = max_req_len - input_len - 1  # SGLang's arithmetic, one token short of max_req_len
    return max(0, min(granted, by_length, pool_room_for_output(input_len, pool_size, page_size)))
