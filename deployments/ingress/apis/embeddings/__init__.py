"""OpenAI's embeddings: /v1/embeddings, over a served embedder's core (`ingress/embedding/`)."""
