"""The embedding core that the embeddings API formats (`core.EmbeddingCore`, held per served embedder
by `served_models`), and OpenAI's `cl100k_base` token ids read back as text (`cl100k`).
"""
