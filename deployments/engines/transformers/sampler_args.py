"""A request's sampling parameters, and how they travel to the continuous batch's sampler
(`batch_sampler.py`): one int32 column per logits row in the manager's argument storage (`Arg`),
with the row's flags (`Row`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, IntFlag


class Arg(IntEnum):
    """The sampler's rows in the manager's argument storage: one int32 column per logits row."""

    TEMPERATURE = 0  # float32 bits; 1.0 for greedy rows
    TOP_K = 1  # int; the vocabulary when off, 1 for greedy rows
    TOP_P = 2  # float32 bits
    MIN_P = 3  # float32 bits
    FREQUENCY = 4  # float32 bits
    PRESENCE = 5  # float32 bits
    U_LOW = 6  # a seeded row's uniform number: float64 bits, low word
    U_HIGH = 7  # high word
    FLAGS = 8  # `Row`
    SLOT = 9  # the row's slot in the per-sequence buffers (0: the shared zero slot)
    REPETITION = 10  # float32 bits; 1.0 is off


class Row(IntFlag):
    """A row's flags (`Arg.FLAGS`): what the sampler must do for it."""

    GREEDY = 1
    SEEDED = 2
    GRAMMAR = 4
    LOGPROBS = 8


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling, fixed for its life. `temperature` 0 is greedy; `top_k` 0 is off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    frequency: float = 0.0
    presence: float = 0.0
    seed: int | None = None
    repetition: float = 1.0
    banned: tuple[int, ...] = ()  # never chosen (ignore_eos: the end of sequence)
    held: tuple[int, ...] = ()  # not chosen before the sequence has `held_until` tokens (min_tokens)
    held_until: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return bool(self.frequency or self.presence or self.repetition != 1.0)

    @property
    def suppresses(self) -> bool:
        return bool(self.banned or (self.held and self.held_until))

    @property
    def needs_slot(self) -> bool:
        return self.penalized or self.suppresses
