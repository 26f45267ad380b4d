"""What a request may cost in tokens, before anything reads it: the tokens per minute that its
admission reserves (OpenAI's rule: an estimate of the prompt from its characters, plus the
completion budget for each choice). The real count settles it when it ends.

- The prompt: its strings' characters over `CHARS_PER_TOKEN` (names and settings included, as a
  chat template adds its own), an image as `IMAGE_TOKENS` (its data or URL, never its bytes), token
  ids (a legacy completion's or an embedding's) one each.
- A document: a text document by its characters (the decoded size of a text data URL, Anthropic's
  `text` source); a PDF by its bytes, `PDF_CHARS_PER_BYTE`, until it is read; a stored file
  (`file_id`) by its stored size. Documents together count at most the documents' character cap
  (`documents.max_chars_per_request`: the stage leaves out the pages beyond it).
- Stored content a request names (`previous_response_id`, `conversation`) by its stored size.
- The completion budget: the `max_tokens` the API will use, read by the API's own fields as its
  route's declaration says (`counting.Budget`: their coercion, `"400"` and `400.0` are 400 there and
  here; `max_completion_tokens` before `max_tokens` as chat applies them; legacy completions' default
  of 16), the model's default when the request sets none, for each of its `n` choices and each of
  its prompts (a legacy completion's list).

Only the caller's own stored objects are found (`StoredSizes`, the stores' owner rule): another
key's count 0, as they are not found. What the request carries is `Estimate.known`; what is guessed
from a size (a PDF, stored content) is `Estimate.guessed`, which reserves at most what the key's
bucket holds: a guess never makes a request "too large ever to fit", and the settlement charges
what it really used.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import ValidationError

from deployments.config import DocumentInputConfig
from deployments.errors import ObjectNotFoundError
from deployments.ingress.limits.counting import Budget
from deployments.protocol.openai.common import SamplingFields
from deployments.state.conversations import items_path
from deployments.state.owners import Caller

if TYPE_CHECKING:
    from deployments.state.conversations import ConversationStore
    from deployments.state.files import FileStore
    from deployments.state.responses import StoredResponses

CHARS_PER_TOKEN = 4  # English text in the BPE vocabularies of the models served; the settlement corrects it
IMAGE_TOKENS = 85  # an image's caption or its place holder (OpenAI counts a low-detail image as 85)
# A PDF's text per byte of the file: 0.24 and 0.27 in two text PDFs of Debian's manuals (fonts and
# compressed page streams); a scan has less (its pages are captioned, about IMAGE_TOKENS each).
PDF_CHARS_PER_BYTE = 0.25
DOCUMENT_CHARS = DocumentInputConfig.model_fields["max_chars_per_request"].default
_IMAGE_KEYS = frozenset({"image_url", "url", "data", "image"})
_DOCUMENT_KEYS = ("file_data", "file_id", "file_url")  # chat's `file` object and Responses' `input_file`
_DOCUMENT_MARKS = frozenset({*_DOCUMENT_KEYS, "source"})  # a dict that may be a document
_TOKEN_ID_KEYS = ("prompt", "input")  # a legacy completion's and an embedding's token ids
_PDF_MAGIC = b"%PDF-"
T = TypeVar("T")


class StoredSizes(Protocol):
    """What the estimate reads of the stores (the real ones: `StoreSizes`): the size of a stored
    object of the caller whose API key's SHA-256 is `owner` (None: no keys set), or None when the
    caller has none by that id (unknown, expired, or another key's).
    """

    async def file(self, owner: bytes | None, file_id: str) -> StoredFile | None: ...

    async def response(self, owner: bytes | None, response_id: str) -> int | None: ...

    async def conversation(self, owner: bytes | None, conversation_id: str) -> int | None: ...


@dataclass(frozen=True)
class StoredFile:
    """A /v1/files upload as the estimate sees it: its bytes, and whether its name says it is a PDF
    (its bytes are read only by the document stage).
    """

    size: int
    pdf: bool


@dataclass(frozen=True)
class Estimate:
    """A request's tokens: `known` from what it carries (with its completion budget), `guessed` from
    sizes (a PDF not read yet, stored content).
    """

    known: int
    guessed: int = 0

    def reserve(self, bucket: int | None) -> int:
        """The tokens to reserve against a bucket of `bucket` tokens (None: no token limit): the
        guess at most up to the bucket's size.
        """
        if bucket is None:
            return self.known + self.guessed
        return self.known + min(self.guessed, max(0, bucket - self.known))


@dataclass(frozen=True)
class Estimator:
    """A request's estimate, with the stores it may name (`sizes`; None: nothing stored is read)
    and the documents' character cap of a request.
    """

    sizes: StoredSizes | None = None
    document_chars: int = DOCUMENT_CHARS

    async def estimate(
        self,
        body: dict[str, Any],
        default_max_tokens: int | None,
        owner: bytes | None = None,
        budget: Budget | None = None,
    ) -> Estimate:
        """`body`'s estimate; `default_max_tokens`: the model's, for a request that sets none (None:
        the route generates nothing); `owner`: the caller's key digest; `budget`: how the route's API
        reads the completion budget (its declaration's).
        """
        walk = _Walk.of(body)
        completion = 0 if default_max_tokens is None else completion_tokens(body, default_max_tokens, budget)
        stored = await self._stored(walk, body, owner)
        text_docs = min(walk.text_chars, self.document_chars)
        pdf_docs = min(walk.pdf_chars + stored.document_chars, self.document_chars - text_docs)
        known = (walk.chars + text_docs) // CHARS_PER_TOKEN + walk.images * IMAGE_TOKENS + walk.token_ids + 1
        return Estimate(known + completion, (int(pdf_docs) + stored.chars) // CHARS_PER_TOKEN)

    async def _stored(self, walk: _Walk, body: dict[str, Any], owner: bytes | None) -> _Stored:
        found = _Stored()
        sizes = self.sizes
        if sizes is None:
            return found
        files = await asyncio.gather(*(sizes.file(owner, file_id) for file_id in walk.file_ids))
        for file, named_pdf in zip(files, walk.file_pdfs, strict=True):
            if file is not None:
                found.document_chars += file.size * PDF_CHARS_PER_BYTE if file.pdf or named_pdf else file.size
        previous, conversation = body.get("previous_response_id"), body.get("conversation")
        if isinstance(conversation, dict):
            conversation = conversation.get("id")
        if isinstance(previous, str) and previous:
            found.chars += await sizes.response(owner, previous) or 0
        if isinstance(conversation, str) and conversation:
            found.chars += await sizes.conversation(owner, conversation) or 0
        return found


@dataclass
class _Stored:
    chars: int = 0  # stored responses and conversations
    document_chars: float = 0.0  # stored files


def prompt_tokens(body: Any) -> int:
    """The estimate of what `body` carries (nothing stored is read; documents within the default cap)."""
    walk = _Walk.of(body)
    docs = min(walk.text_chars + int(walk.pdf_chars), DOCUMENT_CHARS)
    return (walk.chars + docs) // CHARS_PER_TOKEN + walk.images * IMAGE_TOKENS + walk.token_ids + 1


# A route that declares no budget: any of the names, chat's precedence, no default of its own.
_ANY = Budget.read(
    SamplingFields, "max_completion_tokens", "max_tokens", "max_output_tokens", n=True, like="max_tokens"
)


def completion_tokens(body: dict[str, Any], default: int, budget: Budget | None = None) -> int:
    """The completion budget: the request's max tokens as its API reads them (`budget`, its route's
    declaration; `default` when it sets none) for each of its `n` choices and each of its prompts. A
    value the API refuses (a 400 there) counts as none.
    """
    budget = budget or _ANY
    try:
        read = budget.fields.model_validate(body)
    except ValidationError:
        return default * prompt_count(body)
    asked = next((value for value in (getattr(read, name) for name in budget.names) if value is not None), default)
    return int(asked) * int(getattr(read, "n", 1)) * prompt_count(body)


def prompt_count(body: dict[str, Any]) -> int:
    """A legacy completion's prompts: a list of strings or of token-id lists is one prompt each."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


class _Walk:
    """A body's parts as the estimate counts them."""

    def __init__(self) -> None:
        self.chars = self.images = self.token_ids = 0
        self.text_chars = 0  # text documents carried
        self.pdf_chars = 0.0  # PDFs carried, by their bytes
        self.file_ids: list[str] = []
        self.file_pdfs: list[bool] = []  # whether the part names its file as a PDF

    @classmethod
    def of(cls, body: Any) -> _Walk:
        walk = cls()
        if isinstance(body, dict):
            for key in _TOKEN_ID_KEYS:
                walk.token_ids += _token_ids(body.get(key))
        stack: list[tuple[Any, str]] = [(body, "")]  # no recursion: any depth that JSON parsed
        while stack:
            value, key = stack.pop()
            if isinstance(value, str):
                if key in _IMAGE_KEYS or value.startswith("data:"):
                    walk.images += 1
                else:
                    walk.chars += len(value)
            elif isinstance(value, dict):
                entries = walk._document(value) if _DOCUMENT_MARKS.intersection(value) else value.items()
                stack.extend((v, k) for k, v in entries)
            elif isinstance(value, list):
                stack.extend((v, key) for v in value)
        return walk

    def _document(self, part: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        """A dict's entries left to walk, once a document in it is counted."""
        source = part.get("source")
        if part.get("type") == "document" and isinstance(source, dict):  # Anthropic's document block
            yield from ((k, v) for k, v in part.items() if k != "source")
            yield from self._anthropic(source)
        elif any(isinstance(part.get(key), str) for key in _DOCUMENT_KEYS):  # chat's file, Responses' input_file
            name = part.get("filename")
            named_pdf = isinstance(name, str) and name.lower().endswith(".pdf")
            if isinstance(data := part.get("file_data"), str):
                self._data(data, named_pdf)
            elif isinstance(file_id := part.get("file_id"), str):
                self.file_ids.append(file_id)
                self.file_pdfs.append(named_pdf)
            else:
                self.images += 1  # a URL is fetched after admission: a place holder until settled
            yield from ((k, v) for k, v in part.items() if k not in _DOCUMENT_KEYS)
        else:
            yield from part.items()

    def _anthropic(self, source: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        kind, data = source.get("type"), source.get("data")
        if kind == "base64" and isinstance(data, str):
            self._data(data, source.get("media_type") == "application/pdf")
        elif kind == "text" and isinstance(data, str):
            self.text_chars += len(data)
        elif kind == "file" and isinstance(file_id := source.get("file_id"), str):
            self.file_ids.append(file_id)
            self.file_pdfs.append(False)
        elif kind == "content":
            yield "content", source.get("content")
        else:
            self.images += 1  # a URL: a place holder until settled

    def _data(self, data: str, named_pdf: bool) -> None:
        """A document's data URL (or bare base64): its decoded size, as text or as a PDF."""
        media, comma, payload = data.partition(",") if data.startswith("data:") else ("", "", data)
        if not comma:
            payload = data
        size = len(payload) * 3 // 4
        if named_pdf or "application/pdf" in media.lower() or _PDF_MAGIC in _head(payload):
            self.pdf_chars += size * PDF_CHARS_PER_BYTE
        else:
            self.text_chars += size


def _head(payload: str) -> bytes:
    """The first KB of base64 data, decoded (where a PDF's header is)."""
    try:
        return base64.b64decode(payload[:1368], validate=False)
    except (binascii.Error, ValueError):
        return b""


def _token_ids(value: Any) -> int:
    """Token ids (a list of ints, or a list of such lists): one token each."""
    if not isinstance(value, list):
        return 0
    return sum(
        1 if isinstance(item, int) else sum(isinstance(t, int) for t in item) if isinstance(item, list) else 0
        for item in value
    )


@dataclass(frozen=True)
class StoreSizes:
    """`StoredSizes` over the service's stores (None: the service keeps no such things). Each call
    reads on a worker thread; a store that fails finds nothing (the estimate is not the request).
    """

    files: FileStore | None = None
    responses: StoredResponses | None = None
    conversations: ConversationStore | None = None

    async def file(self, owner: bytes | None, file_id: str) -> StoredFile | None:
        if self.files is None:
            return None
        found = await _found(self.files.retrieve, file_id, Caller(owner, "limits"))
        if found is None:
            return None
        return StoredFile(int(found.get("bytes") or 0), str(found.get("filename") or "").lower().endswith(".pdf"))

    async def response(self, owner: bytes | None, response_id: str) -> int | None:
        if self.responses is None:
            return None
        return await _found(self.responses.size_of, response_id, Caller(owner, "limits"))

    async def conversation(self, owner: bytes | None, conversation_id: str) -> int | None:
        if self.conversations is None:
            return None
        return await _found(self._conversation_size, conversation_id, Caller(owner, "limits"))

    def _conversation_size(self, conversation_id: str, caller: Caller) -> int | None:
        assert self.conversations is not None
        self.conversations.retrieve(conversation_id, caller)  # not found unless the caller's
        return self.conversations.storage.size(items_path(conversation_id))


async def _found(read: Callable[[str, Caller], T], thing_id: str, caller: Caller) -> T | None:
    try:
        return await asyncio.to_thread(read, thing_id, caller)
    except (ObjectNotFoundError, OSError, ValueError):
        return None
