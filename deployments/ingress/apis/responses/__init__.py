"""OpenAI's Responses API: /v1/responses over HTTP and WebSocket, its stored responses and
/v1/responses/compact. Beside its routes, wire and service: its input as the chat form and its tool
plan (`items`), its output items and events (`output`), the store every ingress replica reaches
(`store`), the WebSocket mode (`socket`), and compaction with its wire (`compaction`).
"""
