"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens. Beside its routes, wire and
service: `chat_form`, the request as the chat form the rest of the service takes.
"""
