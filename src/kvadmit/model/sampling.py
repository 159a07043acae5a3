"""Token sampling with SGLang's parameter names and order: temperature, then top-k, top-p and min-p on the
probabilities, then a draw from the renormalised rest. temperature 0 is greedy; a per-request seed makes a
request's draws reproducible whatever else is in its batch."""

from __future__ import annotations

import torch

from kvadmit.sampling_params import SamplingParams


def filtered_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from: [vocab] probabilities summing to 1."""
    probs = torch.softmax(logits.float() / p.temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if p.top_k > 0:
        keep[p.top_k :] = False
    if p.top_p < 1:
        # Keep the smallest head whose mass reaches top_p: drop a token once the mass before it does.
        before = sorted_probs.cumsum(0) - sorted_probs
        keep &= before < p.top_p
    if p.min_p > 0:
        keep &= sorted_probs >= sorted_probs[0] * p.min_p
    kept = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    out = torch.zeros_like(probs)
    out[order] = kept / kept.sum()
    return out


def token_logprob(
    logits: torch.Tensor, token: int, p: SamplingParams, top: int = 0
) -> tuple[float, list[tuple[float, int]]]:
    """The token's log probability as SGLang reports it: of the logits scaled by the temperature (1 for a
    greedy request), before top-k, top-p and min-p cut the distribution; and the `top` most likely
    tokens' (log probability, token id), most likely first."""
    temperature = 1.0 if p.greedy else p.temperature
    row = torch.log_softmax(logits / temperature, dim=-1)
    best = row.topk(min(top, row.numel())) if top > 0 else None
    pairs = [] if best is None else list(zip(best.values.tolist(), best.indices.tolist(), strict=True))
    return float(row[token]), pairs


class Sampler:
    """Draws one token per request; a seeded request gets its own generator, kept across steps."""

    def __init__(self, default_seed: int = 0) -> None:
        self._shared = torch.Generator().manual_seed(default_seed)
        self._seeded: dict[str, torch.Generator] = {}

    def sample(self, rid: str, logits: torch.Tensor, p: SamplingParams) -> int:
        if p.greedy:
            return int(logits.argmax())
        gen = self._shared
        if p.seed is not None:
            gen = self._seeded.get(rid) or self._seeded.setdefault(rid, torch.Generator().manual_seed(p.seed))
        return int(torch.multinomial(filtered_probs(logits, p), 1, generator=gen))

    def forget(self, rid: str) -> None:
        """Drop a finished request's generator."""
        self._seeded.pop(rid, None)
