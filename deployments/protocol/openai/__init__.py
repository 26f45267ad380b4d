"""OpenAI's wire, a module per API family: `chat` (/v1/chat/completions), `completions` (the legacy
/v1/completions), `items` (the Responses API's items: /v1/responses' input and the
Conversations API's items), and `common`, what they share (the request base that refuses unknown fields, the
sampling fields, content parts, function definitions, usage, logprobs, tool calls, the `vision`
report, the model list and the error body). A new API family is a new module beside them."""
