"""Vision settings: a model's `capabilities`, a captioner's own `captioning:` section, the
file-level `proxy_vision:` (how the ingress uses captioners) and `images:` (what image input it takes).
"""

from __future__ import annotations

import ipaddress
import string
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    model_validator,
)

from deployments.config.chat import ToolCallFormat
from deployments.config.strict import StrictModel


def _vision_mode(value: Any) -> Any:
    # YAML users write `vision_mode: false` or `none`; both mean disabled.
    if value is None or value is False or (isinstance(value, str) and value.lower() in {"none", "false", "off"}):
        return "disabled"
    return value


VisionMode = Annotated[Literal["disabled", "proxy", "native"], BeforeValidator(_vision_mode)]


class Capabilities(StrictModel):
    """What a model can do as a primary (the ``capabilities:`` section of its entry): how it takes images
    and how it writes tool calls.
    """

    vision_mode: VisionMode = Field("disabled", description="disabled | proxy | native.")
    captioner: str | None = Field(
        None, description="Proxy mode: the captioner, a models.yaml entry name or a Hugging Face model id."
    )
    image_token: str | None = Field(
        None, description="Native vision: the image placeholder token. Default: the processor's own (image_token)."
    )
    max_images_per_request: int | None = Field(
        None,
        ge=0,
        description="Native vision: most images in one request for this model (vLLM's limit_mm_per_prompt); "
        "400 beyond. Also the image count of the worst-case batch profiled at start. Default: the file-level "
        "images.max_images_per_request.",
    )

    tool_call_format: Literal["auto", ToolCallFormat] = Field(
        "auto",
        description="How the model writes tool calls, and how the server reads them. auto: from the chat "
        "template: a template that renders `tools` and contains <tool_call> is hermes, [TOOL_CALLS] mistral, "
        "a pythonic call example (`[func_name(`) or <|python_start|> pythonic, <|python_tag|> llama3_json; a "
        "template that does not render tools (or in no known way) gets generic: the tool definitions and the "
        "JSON call format go into the system message. hermes | llama3_json | mistral | pythonic: the model's own "
        "syntax, which its template must render (else the model does not load). generic: always the server's "
        "own format, even for a template that renders tools (docs/tools.md).",
    )

    @model_validator(mode="after")
    def _proxy_needs_captioner(self) -> Capabilities:
        if self.vision_mode == "proxy" and self.captioner is None:
            raise ValueError("vision_mode proxy needs a captioner")
        return self


class CaptioningConfig(StrictModel):
    """A captioner's own settings (the ``captioning:`` section of its models.yaml entry): how its
    replica batches images and how it is prompted.
    """

    prompt_template: str = Field(
        "Describe this image in one or two sentences.",
        description="Caption prompt. May contain {user_text}: the text of the user's message.",
    )
    max_new_tokens: int = Field(64, gt=0, description="Longest caption, in tokens.")
    max_batch_size: int = Field(
        8, gt=0, description="Images captioned in one forward pass by a captioner replica; 1 turns batching off."
    )
    batch_wait_timeout_s: float = Field(
        0.05, ge=0, description="How long a captioner replica waits for more images to fill a batch."
    )

    @model_validator(mode="after")
    def _template_fields(self) -> CaptioningConfig:
        fields = {f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f is not None}
        if fields - {"user_text"}:
            raise ValueError(f"prompt_template may only use {{user_text}}, found {sorted(fields)}")
        return self

    def prompt(self, user_text: str) -> str:
        return self.prompt_template.format(user_text=user_text)


class ProxyVisionConfig(StrictModel):
    """How the ingress uses the captioner (the file-level ``proxy_vision:`` section): deadlines, the
    failure policy, what a degraded answer says, and the caption cache.

    A degraded answer always says so to programs (the `vision` field, `system_fingerprint`, the
    `X-Vision-Degraded` header) and tells the decoder (`media.unseen.unseen_marker`); `degraded_notice`
    is for people behind clients that show only the text, and for decoders too small to follow
    the prompt's instruction.
    """

    timeout_s: float = Field(60.0, gt=0, description="Deadline of one captioning call.")
    on_failure: Literal["degrade", "reject"] = Field(
        "degrade",
        description="When the captioner is down: degrade = answer, telling the decoder the image was not seen, "
        "with a `vision` field in the body and an X-Vision-Degraded header; reject = 503.",
    )
    degraded_notice: str | None = Field(
        None,
        min_length=1,
        description="Text put, as it is, before the answer of a degraded request: before the content of a "
        "completion, and as the first content delta of a stream. Not generated, so not counted in usage's "
        "completion_tokens. null: none (the answer is the decoder's alone).",
    )
    retry_after_s: float = Field(10.0, gt=0, description="After a captioner failure, how long image requests skip it.")
    cache_entries: int = Field(
        4096, ge=0, description="Captions kept per ingress replica, keyed by image hash and prompt; 0 disables."
    )
    cache_mb: float = Field(16.0, gt=0, description="Memory bound of the caption cache (captions and keys), MB.")


def _allow_entry(value: str) -> str:
    entry = value.strip().rstrip(".").lower()
    if not entry or "://" in entry or (("/" in entry or ":" in entry) and _network(entry) is None):
        raise ValueError(f"{value!r} is neither a host name nor an IP address or CIDR network")
    return entry


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None


class ImageInputConfig(StrictModel):
    """Limits and sources of request images (``data:``, ``http(s)://``, ``file://`` URLs)."""

    max_image_bytes: int = Field(20 * 1024 * 1024, gt=0, description="Largest encoded image, in bytes.")
    max_image_pixels: int = Field(40_000_000, gt=0, description="Largest image, width x height (read from the header).")
    allow_remote: bool = Field(True, description="Accept http:// and https:// image URLs at all.")
    connect_timeout_s: float = Field(5.0, gt=0, description="Deadline of DNS lookup plus TCP/TLS connect, per hop.")
    read_timeout_s: float = Field(10.0, gt=0, description="Longest silence while waiting for response bytes.")
    total_timeout_s: float = Field(
        20.0, gt=0, description="Deadline of a whole fetch, redirects and body included (stops slow drips)."
    )
    max_redirects: int = Field(3, ge=0, description="Redirects followed per fetch; each hop is checked again.")
    allow_hosts: list[Annotated[str, AfterValidator(_allow_entry)]] = Field(
        default_factory=list,
        description="Host names or IP/CIDR networks exempt from the private-address guard, e.g. an internal "
        "image store, or 127.0.0.1/32 in tests. Host names match exactly (no wildcards).",
    )
    file_root: str | None = Field(
        None, description="file:// URLs are served only from inside this directory; None rejects file:// URLs."
    )
    max_images_per_request: int = Field(16, ge=0, description="Most image parts in one request (400 beyond).")
    max_images_per_message: int = Field(8, ge=0, description="Most image parts in one message (400 beyond).")
