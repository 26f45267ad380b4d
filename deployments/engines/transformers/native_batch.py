"""Static batches of native-vision requests through one `model.generate`.

transformers 5.24's continuous batching takes token ids only (`add_request(input_ids, ...)`: no
`pixel_values`), so a native VLM batches this way: the requests that are waiting when the model is
free (the replica's `Batcher`, up to `max_num_seqs`) are left-padded into one batch, their images'
tensors concatenated in prompt order, and decoded together, one token per step for every row.

What stays per request inside the shared `generate`:

- sampling (`RowSampler`, a logits processor that leaves `generate` an argmax): each row's own
  temperature, top-k and top-p, its OpenAI penalties, its constraints (logprobs, logit bias, JSON
  grammar: `constraints.constrain`), and its own `torch.Generator` when it has a seed;
- length and cancellation (`RowLimits`): a row ends at its own `max_tokens`, or as soon as its
  stream is closed (stop string, client gone), while the others go on;
- streaming (`RowStreamer`): every step's token goes to its request's `Sink` (the request's
  `ThreadStream` on the event loop).

A batch that fails (out of memory) ends each of its requests with the error; the next batch runs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from deployments.engines.bridge import Sink
from deployments.engines.transformers.constraints import RequestConstraints, constrain
from deployments.engines.transformers.native_prompt import NativePrompt
from deployments.engines.transformers.sampling import Sampling, penalize, warp


class Discarded:
    """A sink that drops what it gets (a job nobody reads)."""

    def send(self, item: int) -> None:
        pass

    def fail(self, error: BaseException) -> None:
        pass

    def end(self) -> None:
        pass


@dataclass
class Collected:
    """A sink that keeps what it gets (the load-time memory profile's jobs)."""

    tokens: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    ended: bool = False

    def send(self, item: int) -> None:
        self.tokens.append(item)

    def fail(self, error: BaseException) -> None:
        self.errors.append(error)

    def end(self) -> None:
        self.ended = True


@dataclass
class NativeJob:
    """One request ready for a batch. `out` gets, from the batch's thread, its tokens, the exception
    if the batch failed, then its end; `cancelled` is set once nobody reads them.
    """

    prompt: NativePrompt
    max_tokens: int
    sampling: Sampling
    dropped_prompt_tokens: int = 0  # what `context_overflow: truncate` dropped
    penalties: tuple[float, float] = (0.0, 0.0)
    seed: int | None = None
    constraints: RequestConstraints | None = None
    out: Sink[int] = field(default_factory=Discarded)
    cancelled: threading.Event = field(default_factory=threading.Event)


def batch_inputs(jobs: Sequence[NativeJob], pad_id: int, device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`generate`'s inputs: ids and per-token outputs left-padded to the longest prompt, the attention
    mask, and the images' tensors concatenated in order (row by row, each row's images in prompt
    order: the order in which the model fills its image tokens).
    """
    width = max(len(job.prompt.ids) for job in jobs)
    ids = torch.full((len(jobs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(jobs), width), dtype=torch.long)
    keys = {key for job in jobs for key in job.prompt.aligned}
    aligned = {key: torch.zeros((len(jobs), width), dtype=torch.long) for key in keys}
    for row, job in enumerate(jobs):
        n = len(job.prompt.ids)
        ids[row, width - n :] = torch.tensor(job.prompt.ids)
        mask[row, width - n :] = 1
        for key in keys:
            aligned[key][row, width - n :] = torch.tensor(job.prompt.aligned.get(key, [0] * n))
    inputs: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": mask, **aligned}
    images = [image.tensors for job in jobs for image in job.prompt.images]
    for key in images[0] if images else ():
        inputs[key] = torch.cat([tensors[key] for tensors in images])
    inputs = {key: value.to(device) for key, value in inputs.items()}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
    return inputs


class RowSampler(LogitsProcessor):
    """Per-row sampling inside one `generate` (which then only takes the argmax): penalties, constraints,
    then each sampled row's draw becomes a one-hot; a step whose rows are all greedy and unconstrained
    leaves the scores as they are.
    """

    def __init__(self, jobs: Sequence[NativeJob], prompt_width: int, device: str) -> None:
        self._jobs = list(jobs)
        self._width = prompt_width
        self._rows = [job.constraints for job in jobs]
        self._greedy = all(job.sampling.greedy for job in jobs)
        self._penalties = any(any(job.penalties) for job in jobs)
        self._generators: list[torch.Generator | None] = []
        for job in jobs:
            generator = None
            if job.seed is not None and not job.sampling.greedy:
                generator = torch.Generator(device=device).manual_seed(job.seed % 2**63)
            self._generators.append(generator)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._penalties:
            frequency = scores.new_tensor([job.penalties[0] for job in self._jobs]).unsqueeze(1)
            presence = scores.new_tensor([job.penalties[1] for job in self._jobs]).unsqueeze(1)
            scores = penalize(scores, input_ids[:, self._width :], frequency, presence)  # type: ignore[assignment]
        step = constrain(scores, self._rows)
        if self._greedy:
            if step is not None:
                step.accept(scores.index_select(0, torch.tensor(step.indices, device=scores.device)).argmax(dim=-1))
            return scores
        chosen = []
        for row, job in enumerate(self._jobs):
            if job.sampling.greedy:
                chosen.append(scores[row].argmax())
                continue
            probs = warp(scores[row].float(), job.sampling).softmax(-1)
            chosen.append(torch.multinomial(probs, 1, generator=self._generators[row])[0])
        tokens = torch.stack(chosen)
        if step is not None:
            step.accept(tokens[step.indices])
        onehot = torch.full_like(scores, float("-inf"))
        onehot.scatter_(1, tokens.unsqueeze(1), 0.0)
        return onehot  # type: ignore[return-value]


class RowLimits(StoppingCriteria):
    """A row is done at its own `max_tokens`, or once its request's stream was closed."""

    def __init__(self, jobs: Sequence[NativeJob], prompt_width: int) -> None:
        self._jobs = list(jobs)
        self._width = prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self._width
        done = [generated >= job.max_tokens or job.cancelled.is_set() for job in self._jobs]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]


class RowStreamer(BaseStreamer):
    """Hands each row's new token to its request, until the row ends (EOS, its length, or cancelled);
    `generate` keeps stepping finished rows with padding, which nobody sees.
    """

    def __init__(self, jobs: Sequence[NativeJob], eos_ids: Sequence[int]) -> None:
        self._jobs = list(jobs)
        self._eos = set(eos_ids)
        self._counts = [0] * len(jobs)
        self._open = [True] * len(jobs)
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt itself
            self._prompt_seen = True
            return
        for row, token in enumerate(value.reshape(-1).tolist()):
            job = self._jobs[row]
            if not self._open[row]:
                continue
            if job.cancelled.is_set():
                self.close(row)
                continue
            job.out.send(token)
            self._counts[row] += 1
            if token in self._eos or self._counts[row] >= job.max_tokens:
                self.close(row)

    def close(self, row: int, error: BaseException | None = None) -> None:
        if self._open[row]:
            self._open[row] = False
            if error is not None:
                self._jobs[row].out.fail(error)
            self._jobs[row].out.end()

    def end(self) -> None:
        for row in range(len(self._jobs)):
            self.close(row)

    def fail(self, error: BaseException) -> None:
        for row in range(len(self._jobs)):
            self.close(row, error)


def run_batch(model: Any, jobs: Sequence[NativeJob], special: dict[str, Any], eos_ids: Sequence[int]) -> None:
    """Generate for `jobs` together (blocking; a worker thread). Never raises: an error ends every
    request of the batch that has not ended yet.
    """
    streamer = RowStreamer(jobs, eos_ids)
    try:
        inputs = batch_inputs(jobs, special["pad_token_id"], str(model.device), model.dtype)
        width = inputs["input_ids"].shape[1]
        config = GenerationConfig(max_new_tokens=max(job.max_tokens for job in jobs), do_sample=False, **special)
        with torch.inference_mode():
            model.generate(
                **inputs,
                generation_config=config,
                logits_processor=LogitsProcessorList([RowSampler(jobs, width, str(model.device))]),
                stopping_criteria=StoppingCriteriaList([RowLimits(jobs, width)]),
                streamer=streamer,
            )
    except BaseException as exc:  # surfaces in each request, not in a dead thread
        streamer.fail(exc)
    finally:
        streamer.end()
