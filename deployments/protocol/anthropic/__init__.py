"""Anthropic's wire: `messages` (/v1/messages and /v1/messages/count_tokens: the request's content
blocks, tools and tool choice, the `message` answer, its stream's events and the error body), and
`chat_form`, the request as the chat messages and function tools the rest of the service takes."""
