"""Whose answer is this? A teacher-forced check that cannot be fooled by batch numerics.

Greedy decoding in a continuous batch is not bitwise batch-invariant (bfloat16 sums, int4 kernels):
where two tokens are nearly tied, another batch shape can pick the other one, and the rest of the
answer follows from there. So an answer that differs from its prompt's lone reference answer is not
evidence of a crossing by itself; nor is one that happens to equal another prompt's reference when
the prompts are alike.

`AnswerScorer` runs the same weights in float32, alone, over `prompt + answer`, and measures at each
answer token how far its logit is below the best one there (the *gap*). An answer the service
produced from its own prompt has only near-ties: gaps well under a logit. A token that came from
another sequence's logits, or from attention over another sequence's cache, sits far below the top
of its own context. `classify` then reads: `ok` (the reference), `drift` (another answer, every
token within `tol` of its own prompt's best), `crossed` (its own prompt does not explain it, another
request's prompt does), `unexplained` (no prompt we sent explains it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deployments.config import load_models_file
from deployments.protocol.replica import TextMessage

DEFAULT_TOL = 1.0  # logits; measured drift stays under 0.2 (docs/reliability.md)


@dataclass(frozen=True)
class Reference:
    """A calibrated prompt: its messages (text only, or None when it holds an image whose caption the
    client does not know), its lone answer and its prompt token count.
    """

    messages: list[dict[str, Any]] | None
    answer: str
    prompt_tokens: int | None


class AnswerScorer:
    """The primary model of a models.yaml, loaded through the service's own loading code in float32."""

    def __init__(self, models_file: Path) -> None:
        from deployments.engines.transformers.sequential import SequentialTextEngine

        primary = load_models_file(models_file).models[0]
        params = primary.params.model_copy(update={"quantization": "none", "dtype": "float32"})
        self.engine = SequentialTextEngine(primary.model_copy(update={"params": params}))
        self._cache: dict[tuple[str, str], float] = {}

    def max_gap(self, messages: list[dict[str, Any]], answer: str) -> float:
        """The largest gap over the answer's tokens, teacher-forced after the chat prompt."""
        key = (repr(messages), answer)
        if key not in self._cache:
            prompt = self.engine.chat_ids([TextMessage(**m) for m in messages], tools=None)
            tokens = self.engine.tokenizer(answer, add_special_tokens=False)["input_ids"]
            if not tokens:
                return 0.0
            with torch.inference_mode():
                logits = self.engine.model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
            chosen = logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]
            self._cache[key] = float((logits.max(-1).values - chosen).max())
        return self._cache[key]

    def discrimination(self, refs: dict[str, Reference], tol: float) -> dict[str, Any]:
        """How well the check tells prompts apart: each reference answer scored after every other
        text prompt whose answer differs. A pair under `tol` is one whose crossing would pass as drift.
        """
        texts = [(r.messages, r.answer) for r in refs.values() if r.messages is not None]
        gaps = [self.max_gap(prompt, answer) for _, answer in texts for prompt, other in texts if other != answer]
        return {
            "pairs": len(gaps),
            "told_apart": sum(g > tol for g in gaps),
            "foreign_gap_p10": round(sorted(gaps)[len(gaps) // 10], 2) if gaps else None,
        }


def classify(
    key: str, text: str, prompt_tokens: int | None, refs: dict[str, Reference], scorer: AnswerScorer | None, tol: float
) -> tuple[str, float | None]:
    """The verdict of a successful answer to calibrated prompt `key`, and its own-prompt gap."""
    ref = refs[key]
    if prompt_tokens != ref.prompt_tokens:  # the decoder counted another request's prompt
        return "crossed", None
    if text == ref.answer:
        return "ok", 0.0
    if scorer is None or ref.messages is None:
        return "drift", None
    gap = scorer.max_gap(ref.messages, text)
    if gap <= tol:
        return "drift", round(gap, 3)
    others = [r.messages for k, r in refs.items() if k != key and r.messages is not None]
    if any(scorer.max_gap(messages, text) <= tol for messages in others):
        return "crossed", round(gap, 3)
    return "unexplained", round(gap, 3)
