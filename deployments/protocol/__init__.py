"""The typed messages of the service. The wire of each public API, a package per vendor and a module
per API family in it: `openai` (chat, completions, and what they share; Anthropic's Messages would
be `anthropic/` beside it). Between the deployments: `replica` (the small typed models sent through
handles to the model replicas and back: never Starlette requests, PIL images or tensors)."""
