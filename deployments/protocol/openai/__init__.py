"""OpenAI's wire, a module per API: `chat` (/v1/chat/completions, and the chat form that every API's
request becomes), `completions` (the legacy /v1/completions), `embeddings`, `responses` (the
/v1/responses request), `items` (the Responses API's items: /v1/responses' input and the
Conversations API's items), `conversations`, `files`, `batches` (the batch object, and the endpoints
a batch may name), `models` (/v1/models), `tokenize` (vLLM's /tokenize and /detokenize, served
beside OpenAI's API), and `common`, what they share (the request base that refuses unknown fields,
the sampling fields, content parts, function definitions, usage, logprobs, tool calls, the `vision`
report and the error body). A new API is a new module beside them.
"""
