"""A PDF that fits the model (issue 67, point 12): the document budget is what the model's context
leaves, counted by the decoder's tokenizer (here a scripted one: a token per 4 characters and 8 a
message, the context 2,048 tokens), through the real vision pipeline and document stage with the
real PDF workers: whole pages left out from the end, named in the prompt and the answer, the first
page always kept."""

from __future__ import annotations

import math

import pytest

from deployments.config import DocumentInputConfig, ImageInputConfig
from deployments.ingress.documents.fit import ContextFit
from deployments.ingress.documents.stage import DocumentStage
from deployments.ingress.vision.pipeline import VisionPipeline
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.replica import TokenizedPrompt, TokenizeInput
from tests.support import pdfs
from tests.unit.ingress.test_documents import file_part, user

CONTEXT = 2048
RESERVE = 256


class ScriptedTokenizer:
    """The decoder's `tokenize` as the stage calls it: a token per 4 characters, 8 per message."""

    def __init__(self, context: int = CONTEXT, down: bool = False) -> None:
        self.context, self.down = context, down
        self.calls = 0

    @staticmethod
    def tokens(request: TokenizeInput) -> int:
        return sum(math.ceil(len(m.content) / 4) + 8 for m in request.messages)

    async def __call__(self, request: TokenizeInput) -> TokenizedPrompt:
        self.calls += 1
        if self.down:
            raise RuntimeError("the decoder is loading")
        count = self.tokens(request)
        return TokenizedPrompt(tokens=[], count=count, max_model_len=self.context)


@pytest.fixture
async def stage():
    documents = DocumentStage(DocumentInputConfig(parse_memory_mb=256), ImageInputConfig())
    yield documents
    await documents.workers.close()


def pipeline(stage: DocumentStage, tokenizer: ScriptedTokenizer) -> VisionPipeline:
    return VisionPipeline(
        None,
        model_name="m",
        images=ImageInputConfig(),
        documents=stage,
        document_fit=ContextFit(tokenizer, RESERVE),
    )


def prompt_tokens(seen) -> int:  # type: ignore[no-untyped-def]
    return ScriptedTokenizer.tokens(TokenizeInput(messages=seen.messages))


async def test_a_pdf_longer_than_the_context_leaves_out_whole_pages_from_the_end(stage):
    pdf = pdfs.numbered_pdf(9, words=200)  # about 1,200 characters a page: 9 pages, about 2,800 tokens
    tokenizer = ScriptedTokenizer()
    seen = await pipeline(stage, tokenizer).prepare(user(file_part(pdf, "spec.pdf")), RequestRecord())
    prompt = seen.messages[0].content
    assert prompt_tokens(seen) + RESERVE <= CONTEXT  # the old code sent all 9 pages: a 400 at the decoder
    kept = [n for n in range(1, 10) if f"Marker{n:03d}" in prompt]
    assert kept == list(range(1, len(kept) + 1)) and 4 <= len(kept) < 9  # whole pages, from the start
    assert f"[document spec.pdf: pages {len(kept) + 1}-9 of 9 were left out" in prompt
    assert seen.degraded is not None and not seen.degraded.headers
    unseen = seen.degraded.report.unseen_pages
    assert [(p.page, p.reason) for p in unseen] == [(n, "truncated") for n in range(len(kept) + 1, 10)]
    assert tokenizer.calls <= 2 + 3


async def test_the_first_page_stays_when_nothing_fits_so_the_decoder_says_400(stage):
    pdf = pdfs.numbered_pdf(3, words=200)
    tokenizer = ScriptedTokenizer(context=RESERVE + 100)  # not even the first page fits
    seen = await pipeline(stage, tokenizer).prepare(user(file_part(pdf, "spec.pdf")), RequestRecord())
    prompt = seen.messages[0].content
    assert "Marker001" in prompt and "Marker002" not in prompt
    assert prompt_tokens(seen) + RESERVE > tokenizer.context  # the decoder's context_length_exceeded


async def test_a_chat_that_surely_fits_is_not_counted_again(stage):
    tokenizer = ScriptedTokenizer(context=100_000)
    model = pipeline(stage, tokenizer)
    for _ in range(3):
        seen = await model.prepare(user(file_part(pdfs.numbered_pdf(2), "a.pdf")), RequestRecord())
        assert "Marker002" in seen.messages[0].content and seen.degraded is None
    assert tokenizer.calls == 1  # the first learns the context; its bytes fit the next ones


async def test_the_character_cap_stands_when_the_decoder_cannot_count(stage):
    tokenizer = ScriptedTokenizer(down=True)
    seen = await pipeline(stage, tokenizer).prepare(
        user(file_part(pdfs.numbered_pdf(9, words=200), "spec.pdf")), RequestRecord()
    )
    assert "Marker009" in seen.messages[0].content  # as before: the decoder will say what it must


async def test_fit_to_context_false_is_the_character_cap_alone():
    documents = DocumentStage(DocumentInputConfig(fit_to_context=False), ImageInputConfig())
    try:
        tokenizer = ScriptedTokenizer()
        seen = await pipeline(documents, tokenizer).prepare(
            user(file_part(pdfs.numbered_pdf(9, words=200), "spec.pdf")), RequestRecord()
        )
    finally:
        await documents.workers.close()
    assert "Marker009" in seen.messages[0].content and tokenizer.calls == 0
