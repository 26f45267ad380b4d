"""`engine: llama.cpp` with a projector file: a GGUF vision-language model as a native primary and as
a captioner, on a tiny VLM built here (the offline SmolLM2 GGUF and a random LLaVA-style mmproj,
`scripts/bench/tiny_models.py`), loaded by llama.cpp as a real one: the prompt with its media
markers, its count against llama.cpp's own, usage, the context, slots shared by image requests."""

import asyncio
import hashlib
import io
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from deployments.config import ModelConfig
from deployments.engines import create_caption_engine, create_text_engine
from deployments.engines.llamacpp import LlamaCppCaptionEngine, LlamaCppTextEngine, LlamaCppVisionEngine
from deployments.engines.llamacpp.media import ImageTokens, data_url, llama_image
from deployments.engines.llamacpp.params import LlamaCppError, read_native_chunk
from deployments.errors import ConfigError, ContextLengthError, InvalidImageError, InvalidRequestError
from deployments.protocol.replica import GenerateRequest, ImageBytes, MessageImage, MessageText, TextMessage
from scripts.bench.tiny_models import SMOLLM2_FILE, TINY_MMPROJ_FILE, tiny_mmproj_image_tokens
from tests.conftest import png_bytes

PER_IMAGE = tiny_mmproj_image_tokens()  # 16
CONTEXT = 256


def vlm_model(folder: Path, entry: dict | None = None, **params) -> ModelConfig:
    """The tiny GGUF VLM as a native primary on llama.cpp; `entry`: other fields of its entry."""
    settings = {"max_num_seqs": 4, "max_model_len": CONTEXT, "temperature": 0, "cpu_threads": 2, **params}
    fields = {
        "name": "tiny-gguf-vlm",
        "engine": "llama.cpp",
        "local_path": str(folder),
        "weight_file": SMOLLM2_FILE,
        "mmproj_file": TINY_MMPROJ_FILE,
        "params": settings,
        "capabilities": {"vision_mode": "native"},
    }
    return ModelConfig.model_validate({**fields, **(entry or {})})


@pytest.fixture(scope="module")
def engine(tiny_gguf_vlm_dir) -> LlamaCppVisionEngine:
    built = create_text_engine(vlm_model(tiny_gguf_vlm_dir))
    assert isinstance(built, LlamaCppVisionEngine)
    yield built
    built.close()


def image(data: bytes) -> ImageBytes:
    return ImageBytes(data=data, sha256=hashlib.sha256(data).hexdigest())


def user(*parts: str | int) -> TextMessage:
    """A user message of text runs (str) and image slots (int: the index in the request's images)."""
    slots = [MessageImage(index=p) if isinstance(p, int) else MessageText(text=p) for p in parts]
    return TextMessage(role="user", content=" ".join(p for p in parts if isinstance(p, str)), parts=slots)


def ask(*images: bytes, text: str = "What is in this picture?", **kw) -> GenerateRequest:
    return GenerateRequest(messages=[user(text, *range(len(images)))], images=[image(i) for i in images], **kw)


async def complete(engine, request: GenerateRequest):
    pieces = [p async for p in engine.generate(request)]
    return "".join(p.text for p in pieces), pieces


def slots_processing(engine) -> int:
    return sum(bool(slot["is_processing"]) for slot in engine._server.call("/slots"))


# --------------------------------------------------------------------------- the prompt and its count


def test_each_image_is_a_marker_where_it_sits_and_the_count_is_llama_cpps(engine):
    red, blue = png_bytes((255, 0, 0)), png_bytes((0, 0, 255), size=(20, 60))
    chat = [user("Compare", 0, "with", 1), TextMessage(role="assistant", content="Sure."), user(0, "again?")]
    prompt = engine.media_prompt(chat, [image(red), image(blue)])
    assert prompt.images == [0, 1, 0]  # marker order: the first image twice
    # No newline is put around a marker, as llama.cpp joins an OpenAI message's parts.
    assert f"Compare{engine.marker}with{engine.marker}" in prompt.text
    assert f"{engine.marker}again?" in prompt.text
    assert prompt.count.images == 3 * PER_IMAGE
    # llama.cpp's own count of the same chat sent the OpenAI way, images and all.
    openai_chat = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare"},
                url_part(red),
                {"type": "text", "text": "with"},
                url_part(blue),
            ],
        },
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": [url_part(red), {"type": "text", "text": "again?"}]},
    ]
    counted = engine._server.call("/v1/chat/completions/input_tokens", {"messages": openai_chat})
    assert prompt.count.total == counted["input_tokens"]


def url_part(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data)}}


async def test_an_image_answer_reports_llama_cpps_prompt_count_with_the_image_tokens(engine):
    request = ask(png_bytes((10, 200, 30)), png_bytes((200, 10, 30)), max_tokens=6)
    counted = engine.media_prompt(request.messages, request.images).count
    text, pieces = await complete(engine, request)
    assert text and pieces[-1].finish_reason == "length" and pieces[-1].completion_tokens == 6
    assert counted.images == 2 * PER_IMAGE
    assert pieces[-1].prompt_tokens == counted.total  # what llama.cpp evaluated: the same count
    without = await complete(
        engine, GenerateRequest(messages=[TextMessage(role="user", content="What is in this picture?")], max_tokens=1)
    )
    assert pieces[-1].prompt_tokens == without[1][-1].prompt_tokens + 2 * PER_IMAGE


async def test_answers_come_from_their_own_image_alone_and_together_in_the_slots(engine):
    images = [
        png_bytes((255, 0, 0)),
        png_bytes((0, 0, 255)),
        png_bytes((0, 255, 0), size=(20, 40)),
        png_bytes((9, 9, 9)),
    ]
    alone = [(await complete(engine, ask(i, max_tokens=24)))[0] for i in images]
    assert len(set(alone)) > 1  # the answers depend on the image
    busy, stop = [0], threading.Event()

    def watch() -> None:  # what llama.cpp itself says: slots processing at once
        while not stop.is_set():
            busy[0] = max(busy[0], slots_processing(engine))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        together = await asyncio.gather(*(complete(engine, ask(i, max_tokens=24)) for i in images))
    finally:
        stop.set()
        watcher.join()
    assert [text for text, _ in together] == alone
    assert busy[0] > 1


async def test_a_chat_over_the_context_is_a_400_that_counts_its_image_tokens(engine):
    images = [png_bytes((i, 0, 0)) for i in range(4)]
    request = ask(*images, max_tokens=CONTEXT - 60)
    prompt = engine.media_prompt(request.messages, request.images).count.total
    message = f"context is {CONTEXT} tokens; the prompt has {prompt} \\({4 * PER_IMAGE} of them image tokens\\)"
    with pytest.raises(ContextLengthError, match=message):
        await complete(engine, request)


async def test_truncation_drops_whole_turns_with_their_images(tiny_gguf_vlm_dir):
    engine = create_text_engine(
        vlm_model(tiny_gguf_vlm_dir, max_num_seqs=1, max_tokens=100, context_overflow="truncate")
    )
    try:
        images = [image(png_bytes((i * 30, 0, 0))) for i in range(9)]
        chat = [
            TextMessage(role="system", content="You are terse."),
            user("Look at these.", *range(8)),
            TextMessage(role="assistant", content="Eight squares."),
            user("And this one?", 8),
        ]
        whole = engine.media_prompt(chat, images).count.total
        kept = engine.media_prompt([chat[0], chat[3]], images)
        assert whole + 100 > CONTEXT >= kept.count.total + 100  # only the last turn leaves room
        text, pieces = await complete(engine, GenerateRequest(messages=chat, images=images))
        assert text and pieces[-1].prompt_tokens == kept.count.total  # llama.cpp got the last turn and its image
        assert pieces[-1].truncated_prompt_tokens == whole - kept.count.total
    finally:
        engine.close()


async def test_text_chats_and_legacy_prompts_run_as_token_ids(engine):
    chat = GenerateRequest(messages=[TextMessage(role="user", content="Hi!")], max_tokens=4)
    _, pieces = await complete(engine, chat)
    assert pieces[-1].prompt_tokens == len(engine.chat_ids(chat.messages))
    text, pieces = await complete(engine, GenerateRequest(prompt="The capital of France is", max_tokens=4))
    assert text and pieces[-1].prompt_tokens == len(engine.text_ids("The capital of France is"))


async def test_logprobs_and_a_closed_stream_free_the_slot(engine):
    _, pieces = await complete(engine, ask(png_bytes((1, 2, 3)), max_tokens=5, logprobs=2))
    logprobs = [lp for p in pieces for lp in p.logprobs]
    assert len(logprobs) == 5 and all(len(lp.top_logprobs) == 2 for lp in logprobs)
    stream = engine.generate(ask(png_bytes((4, 5, 6)), max_tokens=200))
    await anext(stream)
    assert slots_processing(engine) == 1
    closed_at = time.monotonic()
    await stream.aclose()
    while slots_processing(engine) and time.monotonic() - closed_at < 5:
        await asyncio.sleep(0.02)
    assert slots_processing(engine) == 0


async def test_bad_image_slots_and_bytes_are_400s(engine):
    with pytest.raises(InvalidRequestError, match="Image slot 1 has no image"):
        await complete(engine, GenerateRequest(messages=[user("a", 1)], images=[image(png_bytes())]))
    with pytest.raises(InvalidRequestError, match="legacy completion takes no images"):
        await complete(engine, GenerateRequest(prompt="x", images=[image(png_bytes())]))
    with pytest.raises(InvalidImageError, match="could not be read"):  # bytes no ingress checked
        await complete(engine, GenerateRequest(messages=[user("a", 0)], images=[image(b"not an image")]))


def test_native_chunks_as_pieces():
    """llama.cpp's own /completion stream: its stop types as finish reasons, its prompt count, its errors."""
    piece = read_native_chunk({"content": "Hi", "stop": False, "tokens_predicted": 1, "tokens_evaluated": 50})
    assert (piece.text, piece.tokens, piece.finish, piece.prompt_tokens) == ("Hi", 1, None, 50)
    for stop_type, finish in (("limit", "length"), ("eos", "stop"), ("word", "stop")):
        assert read_native_chunk({"content": "", "stop": True, "stop_type": stop_type}).finish == finish
    with pytest.raises(LlamaCppError, match="no slot") as caught:
        read_native_chunk({"error": {"code": 503, "message": "no slot"}})
    assert caught.value.status == 503


# --------------------------------------------------------------------------- images and their tokens


def encoded(fmt: str, mode: str = "RGB", **save) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (8, 6), 200 if mode in ("L", "CMYK") else (200, 30, 30)).save(buffer, format=fmt, **save)
    return buffer.getvalue()


def test_png_and_jpeg_pass_as_they_are_and_other_formats_become_png():
    for data in (encoded("PNG"), encoded("PNG", "RGBA"), encoded("JPEG"), encoded("JPEG", "L")):
        assert llama_image(data) is data
    for data in (encoded("WEBP"), encoded("GIF"), encoded("JPEG", "CMYK")):
        converted = llama_image(data)
        with Image.open(io.BytesIO(converted)) as img:
            assert (img.format, img.mode, img.size) == ("PNG", "RGB", (8, 6))


async def test_a_webp_image_is_answered(engine):
    text, pieces = await complete(engine, ask(encoded("WEBP"), max_tokens=3))
    assert (
        text
        and pieces[-1].prompt_tokens
        == engine.media_prompt(ask(encoded("WEBP")).messages, [image(encoded("WEBP"))]).count.total
    )


def test_image_tokens_fixed_or_measured_once_per_image():
    calls: list[int] = []

    def measure(data: bytes) -> int:
        calls.append(len(data))
        return len(data)

    fixed = ImageTokens(measure, True, b"probe")
    assert [fixed.count(str(i), lambda: b"xx") for i in range(3)] == [5, 5, 5] and calls == [5]
    calls.clear()
    sized = ImageTokens(measure, False, b"probe", entries=2)
    assert sized.count("a", lambda: b"aa") == 2 and sized.count("a", lambda: b"unused") == 2
    assert sized.count("b", lambda: b"bbb") == 3 and sized.count("c", lambda: b"c") == 1
    assert sized.count("a", lambda: b"aaaa") == 4  # forgotten (two entries kept), so measured again
    assert calls == [5, 2, 3, 1, 4] and sized.describe()["measured"] == 4


def test_llama_cpp_measures_an_image_by_its_own_count(engine):
    """The path for projectors whose count depends on the image's size: llama.cpp's counter."""
    measured = ImageTokens(engine._measure, False, png_bytes())
    sizes = [(10, 10), (300, 20), (64, 64)]
    assert [measured.count(str(s), lambda s=s: png_bytes(size=s)) for s in sizes] == [PER_IMAGE] * 3
    assert measured.probe == PER_IMAGE


# --------------------------------------------------------------------------- configuration and the captioner


def test_a_vision_model_needs_its_projector_and_the_text_engine_refuses_native(tiny_gguf_vlm_dir):
    without = vlm_model(tiny_gguf_vlm_dir, {"mmproj_file": None})
    with pytest.raises(ConfigError, match="set mmproj_file"):
        create_text_engine(without)
    with pytest.raises(ConfigError, match="native on llama"):
        LlamaCppTextEngine(vlm_model(tiny_gguf_vlm_dir))


def test_the_captioner_captions_a_batch_in_its_slots(tiny_gguf_vlm_dir):
    captioning = {"max_batch_size": 3, "max_new_tokens": 6}
    model = vlm_model(tiny_gguf_vlm_dir, {"engine": "auto", "capabilities": {}, "captioning": captioning})
    captioner = create_caption_engine(model)  # auto on CPU: llama.cpp for a GGUF captioner
    assert isinstance(captioner, LlamaCppCaptionEngine)
    try:
        images = [Image.new("RGB", (30, 30), colour) for colour in ((255, 0, 0), (0, 0, 255), (0, 160, 0))]
        prompts = ["Describe this image."] * 3
        batch = captioner.caption(images, prompts)
        assert batch == [captioner.caption([img], prompts[:1])[0] for img in images]
        assert len(set(batch)) > 1 and all(batch)
        assert captioner.describe()["slots"] == 3
    finally:
        captioner.close()
