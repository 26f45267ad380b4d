"""What the deployments send each other through handles: the ingress's request to a decoder and the
chunks it streams back, the captioner's request, and a replica's status on /health.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from deployments.protocol.openai.common import FinishReason, TokenLogprob, ToolCall


class MessageText(BaseModel):
    """Native vision: a run of a message's text."""

    type: Literal["text"] = "text"
    text: str


class MessageImage(BaseModel):
    """Native vision: an image's place in a message; `index` is its position in `GenerateRequest.images`."""

    type: Literal["image"] = "image"
    index: int = Field(ge=0)


MessagePart = Annotated[MessageText | MessageImage, Field(discriminator="type")]


class ImageBytes(BaseModel):
    """Native vision: an image the ingress checked, its encoded bytes and their SHA-256 (hex), hashed
    once there (the key of the decoder's processor cache).
    """

    data: bytes
    sha256: str


class TextMessage(BaseModel):
    """A chat message ready for a chat template: text only after proxy vision. An assistant message
    may carry the tool calls it made; a `tool` message answers the call `tool_call_id`.

    Native vision: a user message with images also has `parts`, its text runs and image slots in
    order (what a VLM's chat template renders); `content` is then its text alone.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    parts: list[MessagePart] | None = None


class GrammarSpec(BaseModel):
    """Constrained decoding: output that is a JSON object (`json_object`), or JSON valid against
    `json_schema` (the schema as JSON text). `compact`: at most one space between JSON tokens (a
    tool call, which the server reads: no room for a weak model to spend its budget on layout).
    vLLM's `structured_outputs` adds `regex` (the whole output matches `pattern`), `choice` (exactly
    one of `choices`) and `grammar` (`pattern` is a Lark or GBNF grammar). `param`: the request's
    field it came from, which a 400 about it names.
    """

    kind: Literal["json_object", "json_schema", "regex", "choice", "grammar"]
    json_schema: str | None = None
    pattern: str | None = None
    choices: list[str] | None = None
    compact: bool = False
    param: str = "response_format"


BACKGROUND_PRIORITY = 10
"""vLLM's `priority` at or past which a request is background work (every batch line has it): it runs
on a decoder replica's idle capacity (`engines.admission.Sequences`)."""


class GenerateRequest(BaseModel):
    """Ingress -> PrimaryDecoder. Unset sampling fields take the model's configured defaults.

    A chat is `messages` (rendered by the model's chat template, with `tools` when given); a legacy
    completion is `prompt`, text or token ids used as they are, with no template. Native vision: the
    checked, encoded bytes of the chat's images with their hashes, sent once, which the messages' image
    slots name.
    """

    messages: list[TextMessage] = Field(default_factory=list)
    images: list[ImageBytes] = Field(default_factory=list)
    prompt: str | list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    max_tokens_ceiling: bool = Field(
        False, description="A `max_tokens` above the context's room is cut to it (Anthropic's Messages), not a 400."
    )
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    n: int = Field(1, ge=1, description="Independent sequences; the decoder replica runs each as its own.")
    logprobs: int | None = Field(
        None, ge=0, le=20, description="None: no logprobs; k: each token's logprob and the k most likely tokens."
    )
    logit_bias: dict[int, float] | None = None
    grammar: GrammarSpec | None = None
    # vLLM's extensions (docs/api.md): the sampler's, the stop rules', the text's and the chat's rendering.
    repetition_penalty: float | None = None
    min_tokens: int = Field(0, ge=0, description="EOS, stop_token_ids and stop strings ignored until this many tokens.")
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = Field(
        0,
        description="Admission order when requests wait: lower first, FIFO among equals; BACKGROUND_PRIORITY "
        "or later: background work, on the replica's idle capacity.",
    )
    tenant: str = Field(
        "",
        description="Whose request it is (the API key's, `ingress.limits`): waiters of equal priority are "
        "queued fairly between tenants.",
    )
    tenant_share: float | None = Field(
        None, gt=0, le=1, description="The most of the replica's sequences the tenant may hold at once."
    )
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    adapter: str | None = Field(
        None,
        description="The LoRA adapter to generate with (set by the decoder replica from Serve's multiplexed "
        "model id, once the adapter is loaded); None: the base model.",
    )


class GenerateChunk(BaseModel):
    """PrimaryDecoder -> Ingress, streamed. The last chunk of each sequence (`index`, 0 to n-1) has
    `finish_reason` set; the token counts are the sequence's totals so far, on every chunk (the
    ingress may end an answer before its sequence ends: a repeated tool call); `logprobs` covers the
    tokens whose text this chunk carries; `tool_format` (`capabilities.tool_call_format` as the
    engine resolved it) tells the ingress how to read calls.
    """

    index: int = 0
    text: str = ""
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    truncated_prompt_tokens: int = 0  # prompt tokens dropped to fit the context, on the last chunk
    cached_prompt_tokens: int | None = None  # prompt tokens from the prefix cache, on the last chunk (None: no cache)
    stop_sequence: str | None = None  # the stop string that ended the sequence, on its last chunk
    queued_s: float | None = None  # seconds the sequence waited for a place in the batch, on its first chunk
    tool_format: str | None = None  # a request with tools: how the model writes calls, on each sequence's first chunk


class TokenizeInput(BaseModel):
    """Ingress -> PrimaryDecoder: a prompt to tokenize as the engine would prompt with it (/tokenize,
    /v1/messages/count_tokens). A chat is `messages` (with native vision's `images`) and `tools`,
    rendered by the model's chat template; a completion is `prompt`, text used as it is.
    """

    messages: list[TextMessage] = Field(default_factory=list)
    images: list[ImageBytes] = Field(default_factory=list)
    prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = Field(
        None,
        description="The tokenizer's special tokens (a BOS where it adds one) added to the text. None: as a "
        "request is prompted (a completion's text with them, a chat as its template writes it).",
    )
    add_generation_prompt: bool = Field(True, description="A chat: the template's opening of the answer.")
    continue_final_message: bool = Field(
        False, description="A chat: its final (assistant) message left open, for the answer to continue."
    )
    return_token_strs: bool = False

    @property
    def special_tokens(self) -> bool:
        """`add_special_tokens` resolved: by default a completion's text gets them, a chat does not."""
        return self.add_special_tokens if self.add_special_tokens is not None else self.prompt is not None


class TokenizedPrompt(BaseModel):
    """PrimaryDecoder -> Ingress: a prompt's tokens. `count` is what the prompt takes of the context,
    `image_tokens` of them the images' (native vision): a transformers VLM lists them in `tokens`
    (its placeholder's expansion); a llama.cpp VLM's images have no token ids (mtmd's embeddings), so
    there `tokens` lists the text's alone and `count` is ``len(tokens) + image_tokens``.
    """

    tokens: list[int]
    count: int
    max_model_len: int
    image_tokens: int = 0
    token_strs: list[str] | None = None


class CaptionRequest(BaseModel):
    """Ingress -> VisionCaptioner: encoded image bytes (sent once) and one prompt per image."""

    images: list[bytes]
    prompts: list[str]


class CaptionResult(BaseModel):
    """VisionCaptioner -> ingress: one caption per image, or why it cannot caption now (its model
    is not loaded: the expected offline case). That is an answer, not an error: raised, Serve would
    log a traceback per degraded image request. Any other failure raises.
    """

    captions: list[str] = Field(default_factory=list)
    unavailable: str | None = None


class ComponentStatus(BaseModel):
    """What a deployment says about itself on /health."""

    ready: bool
    model: str | None = None
    reason: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class EmbedRequest(BaseModel):
    """The ingress's request to an embedder: the inputs (all texts, or all token-id lists, as the
    client sent them) and the vector size asked for (None: the model's own).
    """

    inputs: list[str] | list[list[int]]
    dimensions: int | None = None


class EmbedResult(BaseModel):
    """One vector per input, each as little-endian float32 bytes (4 bytes a value: small through the
    handle, and base64 of it is OpenAI's `encoding_format: base64`), and the tokens embedded.
    """

    vectors: list[bytes]
    prompt_tokens: int


class Tenant(BaseModel):
    """Whose request it is, as the ingress's limits know it (`ingress.limits`): the key's `name` (what
    metrics and logs say), its `queue` (the decoders' fair-queueing tenant: one per key), the
    earliest `priority` its requests get, and the `share` of a decoder replica's sequences it may hold.
    """

    model_config = {"frozen": True}

    name: str
    queue: str
    priority: int = 0
    share: float | None = None
