"""The typed messages of the service (a module here imports, of the package, only other modules
here). The wire of each public API, a module per vendor or a package with a module per API:
`openai` (chat completions, completions, embeddings, Responses, Conversations, files, batches, and
vLLM's /tokenize) and `anthropic` (the Messages API). Between the deployments: `replica` (the
small typed models sent through handles to the model replicas and back: never Starlette requests,
PIL images or tensors).
"""
