"""OpenAI's chat completions: /v1/chat/completions."""
