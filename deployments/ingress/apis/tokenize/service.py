"""/tokenize and /detokenize's request logic, apart from their routes (vLLM's
`serving_tokenization`): the served model's decoder tokenizes, with its engine's own tokenizer and
chat template, so that a chat's count is the prompt a chat completion of the same messages and
tools is given (its `usage.prompt_tokens`). The images of a chat become what the decoder counts
through `VisionPipeline.prepare_to_count` (native vision: the model's image tokens; proxy vision:
each image's line without its caption, and `uncaptioned_images`).
"""

from __future__ import annotations

from deployments.ingress.answer.core import AnswerCore
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from deployments.protocol.replica import TokenizeInput
from deployments.tools.plan import plan_tools


class TokenizeService:
    """The request logic of /tokenize and /detokenize for one served model."""

    def __init__(self, core: AnswerCore) -> None:
        self._core = core

    async def tokenize(self, body: TokenizeRequest, record: RequestRecord) -> TokenizeResponse:
        """`record`: what this request's access-log line says (the images' sizes and fetch times)."""
        core = self._core
        deadline = core.deadline()
        flags = {"add_special_tokens": body.add_special_tokens, "return_token_strs": body.return_token_strs}
        uncaptioned = 0
        if body.messages is None:
            request = TokenizeInput(prompt=body.prompt, **flags)
        else:
            async with deadline.within():
                seen = await core.vision.prepare_to_count(body.messages, record)
            uncaptioned = seen.uncaptioned
            request = TokenizeInput(
                messages=seen.messages,
                images=seen.images,
                tools=plan_tools([tool.function for tool in body.tools or []]).tools,
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                **flags,
            )
        counted = await core.tokenize(request, deadline)
        return TokenizeResponse(
            count=counted.count,
            max_model_len=counted.max_model_len or None,
            tokens=counted.tokens,
            token_strs=counted.token_strs,
            image_tokens=counted.image_tokens if request.images else None,
            uncaptioned_images=uncaptioned or None,
        )

    async def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        return DetokenizeResponse(prompt=await self._core.detokenize(body.tokens, self._core.deadline()))
