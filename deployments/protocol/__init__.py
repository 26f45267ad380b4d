"""The typed messages of the service. The OpenAI wire: `requests` (the bodies clients send; unknown
fields are refused) and `responses` (what the service answers, the error body included). Between the
deployments: `payloads` (small typed models sent through handles: never Starlette requests, PIL
images or tensors)."""
