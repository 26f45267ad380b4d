"""/tokenize and /detokenize, in vLLM's shapes (its `TokenizeCompletionRequest`,
`TokenizeChatRequest`, `TokenizeResponse`, `DetokenizeRequest`, `DetokenizeResponse`; llama-server
serves the same routes): not OpenAI's API, but served beside it, on the same models, keys and errors.

One request body takes either form: `prompt` (a completion's text, tokenized as it is, with the
tokenizer's special tokens unless `add_special_tokens` is false) or `messages` (a chat, rendered by
the model's chat template with `tools` as a chat completion's prompt is: `add_generation_prompt`,
`continue_final_message`; `add_special_tokens` false by default, as the template writes its own).
`model` may be left out: the endpoint's default model. Fields vLLM has and this server does not
(`chat_template`, `chat_template_kwargs`, `mm_processor_kwargs`) are refused by name, as every
unknown field is.

The answer adds to vLLM's, only where they apply: `image_tokens` (native vision: how many of `count`
are the images'; on a llama.cpp VLM an image has no token ids, so `tokens` lists the text's alone),
and `uncaptioned_images` (proxy vision: images whose captions are not counted, see docs/api.md).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictInt, model_validator

from deployments.protocol.openai.chat import AssistantMessage, ChatMessage, Tool
from deployments.protocol.openai.common import RequestModel, absent

_CHAT_ONLY = ("tools", "add_generation_prompt", "continue_final_message")


class TokenizeRequest(RequestModel):
    """The body of /tokenize: exactly one of `prompt` (the completion form) and `messages` (the chat form)."""

    model: str | None = Field(None, description="The served model whose tokenizer is used; default: the first.")
    prompt: str | None = Field(None, description="The completion form: text tokenized as it is.")
    messages: list[ChatMessage] | None = Field(
        None, min_length=1, description="The chat form: rendered by the model's chat template."
    )
    tools: list[Tool] | None = Field(None, max_length=128, description="The chat form: tools the template renders.")
    add_special_tokens: bool | None = Field(
        None,
        description="The tokenizer's special tokens (e.g. a BOS) added to the text. Default: true for a "
        "prompt, false for messages (the chat template writes its own).",
    )
    add_generation_prompt: bool = Field(True, description="The chat form: the template's opening of the answer.")
    continue_final_message: bool = Field(
        False,
        description="The chat form: the final assistant message left open, as a prefill the answer continues "
        "(needs add_generation_prompt false).",
    )
    return_token_strs: bool = Field(False, description="Also answer each token's string (`token_strs`).")

    @model_validator(mode="after")
    def _one_form(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt (the completion form) or messages (the chat form)")
        if self.prompt is not None and (chat := [f for f in _CHAT_ONLY if f in self.model_fields_set]):
            raise ValueError(f"{', '.join(chat)}: only with messages (the chat form)")
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
            if not self.messages or not isinstance(self.messages[-1], AssistantMessage):
                raise ValueError("continue_final_message needs a final assistant message to continue")
        return self


class TokenizeResponse(BaseModel):
    """/tokenize's answer: the prompt's token ids and count, and the model's context."""

    count: int = Field(description="The prompt's tokens: what it takes of the context.")
    max_model_len: int | None = Field(description="The model's context (null: an engine with none, the fake).")
    tokens: list[int]
    token_strs: list[str] | None = None
    image_tokens: int | None = Field(
        None, exclude_if=absent, description="Native vision: the images' tokens, counted in `count`."
    )
    uncaptioned_images: int | None = Field(
        None,
        exclude_if=absent,
        description="Proxy vision: images whose captions are not counted (each image's line is, without it).",
    )


class DetokenizeRequest(RequestModel):
    """The body of /detokenize: token ids of the model's vocabulary."""

    model: str | None = Field(None, description="The served model whose tokenizer is used; default: the first.")
    tokens: list[Annotated[StrictInt, Field(ge=0)]] = Field(description="Token ids of the model's vocabulary.")


class DetokenizeResponse(BaseModel):
    """/detokenize's answer: the ids' text."""

    prompt: str
