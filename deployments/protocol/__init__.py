"""The typed messages of the service. The wire of each public API: `openai` (a module per API family,
and what they share). Between the deployments: `replica` (the small typed models sent through
handles to the model replicas and back: never Starlette requests, PIL images or tensors)."""
