import hashlib
import io
import re

import pytest
from PIL import Image
from pydantic import TypeAdapter

from deployments.config import ImageInputConfig
from deployments.errors import InvalidImageError, InvalidRequestError
from deployments.ingress.media.chat import count_images, rewrite
from deployments.ingress.media.unseen import unseen_marker
from deployments.ingress.vision.collect import collect_images
from deployments.protocol.openai.chat import ChatMessage
from tests.conftest import data_url, png_bytes

MESSAGES = TypeAdapter(list[ChatMessage])


def chat(*messages):
    return MESSAGES.validate_python(list(messages))


def img(color=(255, 0, 0)):
    return {"type": "image_url", "image_url": {"url": data_url(png_bytes(color))}}


def test_images_replaced_in_place_and_numbered_across_turns():
    messages = chat(
        {"role": "developer", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "compare"}, img(), {"type": "text", "text": "and"}, img()],
        },
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": [img((0, 0, 255)), {"type": "text", "text": "and this?"}]},
    )
    out = rewrite(messages, ["red square", "red again", "blue square"])
    assert [m.role for m in out] == ["system", "user", "assistant", "user"]
    assert out[0].content == "be brief"
    assert out[1].content == "compare\nImage 1: red square\nand\nImage 2: red again"
    assert out[2].content == "done"
    assert out[3].content == "Image 3: blue square\nand this?"


def test_messages_without_images_pass_unchanged():
    messages = chat({"role": "user", "content": "plain"}, {"role": "user", "content": [{"type": "text", "text": "p"}]})
    assert count_images(messages) == 0
    assert [m.content for m in rewrite(messages, [])] == ["plain", "p"]


def test_an_unseen_image_tells_the_decoder_plainly_not_to_describe_it():
    out = rewrite(
        chat({"role": "user", "content": [{"type": "text", "text": "what?"}, img()]}),
        [unseen_marker("captioner_unavailable")],
    )
    assert out[0].content == (
        "what?\nImage 1: [The user attached an image here, but it could not be seen (the vision model is "
        "unavailable). Do not describe it or guess what it shows; tell the user you cannot see it.]"
    )
    assert "(the vision model did not answer in time)" in unseen_marker("captioner_timeout")


def test_caption_count_must_match():
    with pytest.raises(ValueError, match="1 captions for 2 images"):
        rewrite(chat({"role": "user", "content": [img(), img()]}), ["one"])


async def test_collect_images_carries_bytes_digest_and_user_text():
    red, blue = png_bytes((255, 0, 0)), png_bytes((0, 0, 255))
    messages = chat(
        {"role": "user", "content": [{"type": "text", "text": "what?"}, img((255, 0, 0))]},
        {"role": "user", "content": [img((0, 0, 255))]},
    )
    images = await collect_images(messages, ImageInputConfig())
    assert [i.data for i in images] == [red, blue]
    assert [i.user_text for i in images] == ["what?", ""]
    assert [i.digest for i in images] == [hashlib.sha256(red).hexdigest(), hashlib.sha256(blue).hexdigest()]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png;base64,@@@@", "not valid base64"),
        ("data:image/png;base64," + "aGVsbG8=", "not a readable image"),
        ("data:text/plain;base64,aGVsbG8=", "must look like"),
        ("https://10.0.0.7/cat.png", "is a private address; fetching it is not allowed"),
        ("http://169.254.169.254/latest/meta-data", "cloud metadata"),
        ("file:///etc/passwd", "file:// image URLs are disabled"),
        ("ftp://example.com/cat.png", "Unsupported image URL scheme 'ftp'"),
        ("cat.png", "Unsupported image URL scheme '(none)'"),
    ],
)
async def test_bad_image_urls_are_400s_that_point_at_the_part(url, message):
    messages = chat(
        {"role": "user", "content": "first"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]},
    )
    with pytest.raises(InvalidImageError, match=re.escape(message)) as err:
        await collect_images(messages, ImageInputConfig())
    assert err.value.param == "messages[1].content[1].image_url"
    assert err.value.status == 400


async def test_pixel_bomb_rejected_from_header_only():
    buf = io.BytesIO()
    Image.new("1", (8000, 8000)).save(buf, format="PNG")  # 64 Mpx, a few KB compressed
    messages = chat(
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(buf.getvalue())}}]}
    )
    with pytest.raises(InvalidImageError, match="8000x8000"):
        await collect_images(messages, ImageInputConfig())


async def test_unsupported_format_rejected():
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="BMP")
    messages = chat(
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(buf.getvalue())}}]}
    )
    with pytest.raises(InvalidImageError, match="BMP is not supported"):
        await collect_images(messages, ImageInputConfig())


async def test_image_counts_limited_per_message_and_per_request():
    config = ImageInputConfig(max_images_per_message=2, max_images_per_request=3)
    part = img()
    two = {"role": "user", "content": [part, part]}
    assert len(await collect_images(chat(two), config)) == 2
    with pytest.raises(InvalidRequestError) as err:
        await collect_images(chat({"role": "user", "content": [part] * 3}), config)
    assert err.value.param == "messages[0].content"
    with pytest.raises(InvalidRequestError) as err:
        await collect_images(chat(two, {"role": "assistant", "content": "ok"}, two), config)
    assert (err.value.param, err.value.status) == ("messages", 400)
