"""The client's session hints reach the decoder's handle as Serve's session id, through the real
ingress app (the decoders' router reads it there: `routing.router`)."""

from __future__ import annotations

from tests.unit.ingress.fakes import FakeDecoder
from tests.unit.ingress.test_api import BODY, client


async def test_x_session_id_reaches_the_decoder_handle():
    decoder = FakeDecoder()
    async with client(decoder) as http:
        assert (await http.post("/v1/chat/completions", json=BODY, headers={"x-session-id": "s-1"})).status_code == 200
        assert (await http.post("/v1/chat/completions", json=BODY)).status_code == 200
    assert decoder.session_ids == ["s-1", ""]


async def test_anthropic_user_id_is_the_session_unless_the_header_names_one():
    decoder = FakeDecoder()
    body = {"model": "echo", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"anthropic-version": "2023-06-01"}
    async with client(decoder) as http:
        with_user = {**body, "metadata": {"user_id": "user_abc_session_42"}}
        assert (await http.post("/v1/messages", json=with_user, headers=headers)).status_code == 200
        both = {**headers, "x-session-id": "s-2"}
        assert (await http.post("/v1/messages", json=with_user, headers=both)).status_code == 200
    assert decoder.session_ids == ["user:user_abc_session_42", "s-2"]
