"""`LlamaCppPrompts`: the llama.cpp engine's prompts and tokens, through its server's routes: a chat
rendered by the GGUF's own template (``/apply-template``), text tokenized as llama.cpp prompts with it
(``/tokenize``), ids turned back into text (``/detokenize``), and /tokenize's and /detokenize's
answers. `LlamaCppTextEngine` is built on it; its server's errors that are the request's fault are 400s.
"""

from __future__ import annotations

from typing import Any

from deployments.config import ToolCallFormat
from deployments.engines.extensions import template_variables
from deployments.engines.llamacpp.params import LlamaCppError
from deployments.engines.llamacpp.server import LlamaServer
from deployments.engines.tokens import check_token_ids
from deployments.errors import InvalidRequestError
from deployments.protocol.replica import TextMessage, TokenizedPrompt, TokenizeInput
from deployments.tools.prompt import generic_chat, template_message


def chat_message(message: TextMessage) -> dict[str, Any]:
    """A message as llama.cpp's chat template takes it (OpenAI's form)."""
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


class LlamaCppPrompts:
    """The prompt and token side of a llama.cpp engine, over its running server."""

    _server: LlamaServer
    tool_format: ToolCallFormat
    vocab_size: int
    max_model_len: int

    def chat_ids(self, messages: list[TextMessage], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The chat rendered by the GGUF's template, with the generation prompt, as token ids."""
        return self.text_ids(self.render_chat(messages, tools))

    def render_chat(
        self,
        messages: list[TextMessage],
        tools: list[dict[str, Any]] | None,
        contents: list[Any] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The chat rendered by the GGUF's template (llama.cpp's ``/apply-template``), by default with
        the generation prompt; `contents`: each message's content as llama.cpp takes it (the vision
        engine's text and image parts), else its text. A final assistant message is left open
        (llama.cpp's prefill: the answer continues it). `template_kwargs`: vLLM's `chat_template_kwargs`,
        the template's extra variables (llama.cpp's own field of that name).
        """
        generic = self.tool_format == "generic"  # tools, calls and results as text any template renders
        rendered = [template_message(m) if generic else chat_message(m) for m in messages]
        for message, content in zip(rendered, contents or (), strict=False):
            message["content"] = content
        if generic:
            chat: dict[str, Any] = {"messages": generic_chat(rendered, tools)}
        else:
            chat = {"messages": rendered, **({"tools": tools} if tools else {})}
        if not add_generation_prompt:
            chat["add_generation_prompt"] = False
        if template_kwargs:
            chat["chat_template_kwargs"] = template_variables(template_kwargs)
        return str(self._call("/apply-template", chat, "messages")["prompt"])

    def text_ids(self, text: str) -> list[int]:
        """Text as llama.cpp tokenizes a prompt: with the tokens the model adds (a BOS where it
        adds one), and special tokens written in the text parsed as such.
        """
        return self.text_tokens(text)[0]

    def text_tokens(self, text: str, add_special: bool = True, pieces: bool = False) -> tuple[list[int], list[str]]:
        """llama.cpp's ``/tokenize`` of `text` (special tokens written in it parsed as such): the ids,
        and with `pieces` each token's text (a piece that is not whole UTF-8 comes as bytes, here
        decoded with replacement characters).
        """
        body = {"content": text, "add_special": add_special, "parse_special": True, "with_pieces": pieces}
        tokens = self._call("/tokenize", body, "prompt")["tokens"]
        if not pieces:
            return [int(t) for t in tokens], []
        return [int(t["id"]) for t in tokens], [piece_text(t["piece"]) for t in tokens]

    # ------------------------------------------------------------------ /tokenize and /detokenize

    def tokenize(self, request: TokenizeInput) -> TokenizedPrompt:
        """A completion's text with the model's special tokens when `add_special_tokens`; a chat as
        `generate` prompts with it (rendered, then tokenized with what the model adds: its prompts
        always carry that, so the chat form's `add_special_tokens` changes nothing here). llama.cpp
        continues a final assistant message whatever it is told, so a chat that ends with one needs
        `continue_final_message`.
        """
        if request.prompt is not None:
            ids, strs = self.text_tokens(request.prompt, request.special_tokens, request.return_token_strs)
            return self._tokenized(ids, strs, request)
        self._check_final_message(request)
        if request.images:
            return self.media_tokens(request)
        text = self.render_chat(request.messages, request.tools, add_generation_prompt=request.add_generation_prompt)
        return self._tokenized(*self.text_tokens(text, True, request.return_token_strs), request)

    def media_tokens(self, request: TokenizeInput) -> TokenizedPrompt:
        """A chat with images (`LlamaCppVisionEngine`'s); this engine takes none."""
        raise InvalidRequestError("This model's llama.cpp engine takes no images.", param="messages")

    def _tokenized(
        self, ids: list[int], strs: list[str], request: TokenizeInput, image_tokens: int = 0
    ) -> TokenizedPrompt:
        return TokenizedPrompt(
            tokens=ids,
            count=len(ids) + image_tokens,
            max_model_len=self.max_model_len,
            image_tokens=image_tokens,
            token_strs=strs if request.return_token_strs else None,
        )

    @staticmethod
    def _check_final_message(request: TokenizeInput) -> None:
        if request.messages and request.messages[-1].role == "assistant" and not request.continue_final_message:
            raise InvalidRequestError(
                "On this model's engine (llama.cpp) a final assistant message is always continued (its prefill): "
                "set continue_final_message to true, or end the chat with another role.",
                param="continue_final_message",
            )

    def detokenize(self, tokens: list[int]) -> str:
        if not tokens:
            return ""
        check_token_ids(tokens, self.vocab_size, "tokens")  # llama.cpp indexes its vocabulary unchecked
        return str(self._call("/detokenize", {"tokens": tokens}, "tokens")["content"])

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A legacy completion's prompt as it is: text tokenized, token ids checked."""
        ids = self.text_ids(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        return check_token_ids(ids, self.vocab_size, "prompt") if isinstance(prompt, list) else ids

    def _call(self, path: str, body: dict[str, Any], param: str) -> Any:
        try:
            return self._server.call(path, body)
        except LlamaCppError as exc:
            if 400 <= exc.status < 500:
                raise InvalidRequestError(f"llama.cpp: {exc}", param=param) from None
            raise


def piece_text(piece: str | list[int]) -> str:
    """A token's text as llama.cpp's /tokenize gives it: a string, or its bytes when they are not
    whole UTF-8 (a piece of a multi-byte character).
    """
    return piece if isinstance(piece, str) else bytes(piece).decode(errors="replace")
