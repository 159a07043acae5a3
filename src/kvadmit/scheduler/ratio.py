"""The new-token ratio: how much of its remaining max_new_tokens a running request is expected to use.

Reference §2. It starts at min(0.7 × schedule_conservativeness, 1), falls linearly by
(init − min) / 600 per decode step to min = init × 0.14, jumps to an estimate after a retraction, and
returns to init only when the scheduler is fully idle.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvadmit.config import SchedulerKnobs


@dataclass(slots=True)
class NewTokenRatio:
    init: float
    min: float
    decay: float
    current: float

    @classmethod
    def from_config(cls, schedule_conservativeness: float, knobs: SchedulerKnobs) -> NewTokenRatio:
        init = min(knobs.init_new_token_ratio * schedule_conservativeness, 1.0)
        floor = min(init * knobs.min_new_token_ratio_factor, 1.0)
        decay = (init - floor) / knobs.new_token_ratio_decay_steps
        return cls(init=init, min=floor, decay=decay, current=init)

    def decay_step(self) -> None:
        """One decode step that went well (no retraction): a little bolder, never below the floor."""
        self.current = max(self.current - self.decay, self.min)

    def reset(self) -> None:
        """The scheduler is fully idle: start over from the initial ratio."""
        self.current = self.init


def ratio_after_retract(
    remaining_output_lens: list[int], remaining_max_new_tokens: list[int], retract_decode_steps: int
) -> float:
    """The estimate after a retraction, over the requests that remain in the decode batch:

        min(1, (Σ outputs so far + retract_decode_steps × n) / (Σ max_new_tokens + 1))

    max_new_tokens unclipped; with nothing left it is 0 / 1 = 0.0 (the next decay lifts it to the floor).
    """
    n = len(remaining_output_lens)
    numerator = sum(remaining_output_lens) + retract_decode_steps * n
    return min(1.0, numerator / (sum(remaining_max_new_tokens) + 1))
