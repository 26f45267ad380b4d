"""What is served and whether it can answer: /v1/models, /v1/models/{model}, /health."""
