"""What a request reserves, through the limits middleware with an in-process ledger (as
test_limiter builds it): a legacy completion's prompts each reserve their budget and all of them
are settled; max_tokens and n read as the API reads them; documents by their characters or bytes;
stored content (a file, a stored response, a conversation) by its stored size, the caller's only."""

from __future__ import annotations

import base64
import hashlib

import httpx
import pytest

from deployments.config import ServerConfig
from deployments.config.limits import parse_limits
from deployments.ingress.api import build_api
from deployments.ingress.apis.counting import ROUTES
from deployments.ingress.guard import GuardSettings
from deployments.ingress.limits import estimate
from deployments.ingress.limits.estimate import Estimate, Estimator, StoreSizes
from deployments.ingress.limits.ledger import Caps, Verdict
from deployments.ingress.limits.limiter import Limiter
from deployments.ingress.limits.table import KeyTable
from deployments.state.conversations import ConversationStore
from deployments.state.files import FileStore
from deployments.state.owners import Caller
from deployments.state.records import stored_owners
from deployments.state.responses import StoredResponses
from tests.support.pdfs import numbered_pdf
from tests.support.stores import temporary_storage
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder
from tests.unit.ingress.limits.test_limiter import LocalBoard, served_models

KEY_A, KEY_B, KEY_SMALL = "sk-estimate-a-000000", "sk-estimate-b-000000", "sk-estimate-small-0"
LIMITS = f"""
keys:
  - name: team-a
    key_sha256: {hashlib.sha256(KEY_A.encode()).hexdigest()}
    tokens_per_minute: 1000000
  - name: team-b
    key_sha256: {hashlib.sha256(KEY_B.encode()).hexdigest()}
    tokens_per_minute: 1000000
  - name: small
    key_sha256: {hashlib.sha256(KEY_SMALL.encode()).hexdigest()}
    tokens_per_minute: 1000
"""
DEFAULT_MAX_TOKENS = 64


class CountingBoard(LocalBoard):
    """The ledger's board, with the tokens each admission reserved."""

    def __init__(self) -> None:
        super().__init__()
        self.reserved: list[int] = []

    async def admit(self, name: str, caps: Caps, tokens: int) -> Verdict | None:
        self.reserved.append(tokens)
        return await super().admit(name, caps, tokens)


def client(
    board: CountingBoard, metrics: FakeMetrics, estimator: Estimator | None = None, decoder: FakeDecoder | None = None
) -> httpx.AsyncClient:
    served = served_models(decoder or FakeDecoder(["a", "b", "c"]))
    table = KeyTable(parse_limits(LIMITS, "limits.yaml"), None, environ={})
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None), extra_keys=table)
    limiter = Limiter(
        table, board, served, {"echo": DEFAULT_MAX_TOKENS}, metrics, estimator or Estimator(), routes=ROUTES
    )
    api = build_api(served, guard, metrics, limiter=limiter)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def owner(key: str) -> Caller:
    return Caller(hashlib.sha256(key.encode()).digest())


def chat_with(part: dict) -> dict:
    return {"model": "echo", "max_tokens": 10, "messages": [{"role": "user", "content": [part]}]}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_legacy_completions_prompts_each_reserve_their_budget_and_all_are_settled(stream: bool) -> None:
    board, metrics = CountingBoard(), FakeMetrics()
    body = {"model": "echo", "prompt": [f"prompt {i}" for i in range(20)], "max_tokens": 11, "n": 2, "stream": stream}
    async with client(board, metrics) as http:
        reply = await http.post("/v1/completions", json=body, headers=auth(KEY_A))
        assert reply.status_code == 200
        if not stream:
            usage = reply.json()["usage"]
            assert usage["prompt_tokens"] == 20 * 3 and usage["completion_tokens"] == 20 * 2 * 3
    assert board.reserved == [estimate.prompt_tokens(body) + 20 * 2 * 11]
    # The fake decoder: 3 prompt tokens a prompt, 3 tokens a sequence; 40 choices.
    assert board.settled[0][1] == 20 * 3 + 40 * 3
    assert metrics.count("key_prompt_tokens", key="team-a") == 60
    assert metrics.count("key_completion_tokens", key="team-a") == 120


async def test_token_id_prompts_count_as_prompts_and_as_tokens() -> None:
    board = CountingBoard()
    lists = {"model": "echo", "prompt": [[1, 2, 3, 4]] * 10, "max_tokens": 5}
    one = {"model": "echo", "prompt": [7] * 400, "max_tokens": 5}
    async with client(board, FakeMetrics()) as http:
        assert (await http.post("/v1/completions", json=lists, headers=auth(KEY_A))).status_code == 200
        assert (await http.post("/v1/completions", json=one, headers=auth(KEY_A))).status_code == 200
    text = estimate.prompt_tokens({"model": "echo"})  # what the rest of the body counts
    assert board.reserved == [text + 40 + 10 * 5, text + 400 + 5]
    assert board.settled[0][1] == 10 * 3 + 10 * 3


@pytest.mark.parametrize(
    "budget",
    [
        {"max_tokens": "400", "n": 3},
        {"max_tokens": 400.0, "n": "3"},
        {"max_tokens": " 1_200 "},
        {"max_completion_tokens": "1200", "max_tokens": 10},
    ],
)
async def test_max_tokens_as_the_api_reads_it_meets_the_too_large_refusal(budget: dict) -> None:
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], **budget}
    async with client(CountingBoard(), FakeMetrics()) as http:
        refused = await http.post("/v1/chat/completions", json=body, headers=auth(KEY_SMALL))
    assert refused.status_code == 429 and refused.headers["x-should-retry"] == "false"
    assert "limit 1000" in refused.json()["error"]["message"]


async def test_max_completion_tokens_wins_and_the_legacy_default_is_sixteen() -> None:
    board = CountingBoard()
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    legacy = {"model": "echo", "prompt": "hi"}
    bodies = [
        ("/v1/chat/completions", {**chat, "max_completion_tokens": "7", "max_tokens": 5000}),
        ("/v1/completions", legacy),
        ("/v1/completions", {**legacy, "max_tokens": None}),  # null: the model's default, as the decoder takes it
    ]
    async with client(board, FakeMetrics()) as http:
        for route, body in bodies:
            assert (await http.post(route, json=body, headers=auth(KEY_SMALL))).status_code == 200
    budgets = [
        reserved - estimate.prompt_tokens(body) for reserved, (_, body) in zip(board.reserved, bodies, strict=True)
    ]
    assert budgets == [7, 16, DEFAULT_MAX_TOKENS]


def text_document(chars: int) -> str:
    return "data:text/plain;base64," + base64.b64encode(b"x" * chars).decode()


async def test_a_text_document_reserves_its_characters_in_each_apis_shape() -> None:
    board = CountingBoard()
    document = text_document(20_000)
    bodies = [
        ("/v1/chat/completions", chat_with({"type": "file", "file": {"file_data": document, "filename": "a.txt"}})),
        (
            "/v1/responses",
            {"model": "echo", "input": [{"role": "user", "content": [{"type": "input_file", "file_data": document}]}]},
        ),
        (
            "/v1/messages",
            {
                "model": "echo",
                "max_tokens": 10,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "text", "data": "y" * 20_000}}],
                    }
                ],
            },
        ),
    ]
    async with client(board, FakeMetrics()) as http:
        for route, body in bodies:
            await http.post(route, json=body, headers=auth(KEY_A))  # its answer is the document stage's
    assert len(board.reserved) == 3 and all(5_000 <= reserved < 5_000 + 200 for reserved in board.reserved)


async def test_a_pdf_reserves_by_its_bytes_until_it_is_read() -> None:
    board = CountingBoard()
    pdf = numbered_pdf(40, words=200)
    part = {"type": "file", "file": {"file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode()}}
    async with client(board, FakeMetrics()) as http:
        await http.post("/v1/chat/completions", json=chat_with(part), headers=auth(KEY_A))
    guess = int(len(pdf) * estimate.PDF_CHARS_PER_BYTE) // estimate.CHARS_PER_TOKEN
    assert guess > 1_000 and guess <= board.reserved[0] - 10 < guess + 50


def test_documents_count_at_most_the_documents_cap_and_a_guess_at_most_the_bucket() -> None:
    many = [{"type": "file", "file": {"file_data": text_document(300_000)}} for _ in range(3)]
    body = {"model": "echo", "messages": [{"role": "user", "content": many}]}
    assert estimate.prompt_tokens(body) < estimate.DOCUMENT_CHARS // estimate.CHARS_PER_TOKEN + 100
    assert Estimate(known=300, guessed=5_000).reserve(1_000) == 1_000
    assert Estimate(known=1_200, guessed=5_000).reserve(1_000) == 1_200  # what it carries may be too large
    assert Estimate(known=300, guessed=5_000).reserve(None) == 5_300


def test_a_deeply_nested_body_is_walked_without_recursion() -> None:
    body: object = "x" * 40
    for _ in range(50_000):
        body = [body]
    assert estimate.prompt_tokens({"messages": body}) == 40 // 4 + 1


async def test_stored_content_reserves_by_its_stored_size_and_only_the_callers() -> None:
    storage = temporary_storage()
    owners = stored_owners(storage)
    files = FileStore(storage, owners, ServerConfig().batches)
    responses = StoredResponses(storage, owners, 1 << 24, 3600.0)
    conversations = ConversationStore(storage, owners, 1 << 24)
    text = "word " * 8_000  # 40,000 characters
    file_id = files.create("notes.txt", text.encode(), "user_data", owner(KEY_A))["id"]
    pdf_id = files.create("paper.pdf", numbered_pdf(20, words=200), "user_data", owner(KEY_A))["id"]
    entry = {"response": {"output": []}, "input": [], "conversation": [{"role": "user", "content": text}]}
    await responses.put("resp_estimate0001", entry, owner(KEY_A))
    message = {"type": "message", "role": "user", "content": text}
    conversation_id = conversations.create([message], None, owner(KEY_A))["id"]
    estimator = Estimator(StoreSizes(files, responses, conversations))
    bodies = [
        ("/v1/chat/completions", chat_with({"type": "file", "file": {"file_id": file_id}})),
        ("/v1/responses", {"model": "echo", "input": "more", "previous_response_id": "resp_estimate0001"}),
        ("/v1/responses", {"model": "echo", "input": "more", "conversation": conversation_id}),
        ("/v1/responses", {"model": "echo", "input": "more", "conversation": {"id": conversation_id}}),
        ("/v1/chat/completions", chat_with({"type": "file", "file": {"file_id": pdf_id}})),
    ]
    for key in (KEY_A, KEY_B):
        board = CountingBoard()
        async with client(board, FakeMetrics(), estimator) as http:
            for route, body in bodies:
                await http.post(route, json=body, headers=auth(key))
        stored = [
            reserved - estimate.prompt_tokens(body) for reserved, (_, body) in zip(board.reserved, bodies, strict=True)
        ]
        if key == KEY_A:
            assert stored[0] == 10_000 + 10 and all(10_000 <= extra < 10_600 for extra in stored[1:4])
            pdf_size = int(files.retrieve(pdf_id, owner(KEY_A))["bytes"])
            assert abs(stored[4] - 10 - pdf_size * estimate.PDF_CHARS_PER_BYTE / estimate.CHARS_PER_TOKEN) < 2
        else:  # another key's are not found: nothing stored is counted
            assert stored == [10, DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS, 10]
