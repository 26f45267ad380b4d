"""``engine: llama.cpp``: GGUF models on llama.cpp's own server code, in the replica's process
(the `xllamacpp` wheel), with llama.cpp's continuous batching over `max_num_seqs` slots.

- `engine`: `LlamaCppTextEngine`, the `TextEngine` (prompt, context, streaming, cancellation,
  stats);
- `vision`: `LlamaCppVisionEngine`, a GGUF VLM (its `mmproj_file`) as a native vision primary;
  `media`: images as llama.cpp takes them and their prompt tokens; `captioner`:
  `LlamaCppCaptionEngine`, the VLM as a captioner;
- `server`: the in-process llama.cpp server (its settings, streamed requests, its local routes);
- `params`: our request as llama.cpp's completion request, its chunks as our pieces;
- `gguf_meta`: the GGUF header (context length, KV-cache shape) read before loading.

Only `deployments.engines.factory` imports this package, and only for ``engine: llama.cpp``, so
the other engines never load xllamacpp.
"""

from deployments.engines.llamacpp.captioner import LlamaCppCaptionEngine
from deployments.engines.llamacpp.engine import LlamaCppTextEngine
from deployments.engines.llamacpp.vision import LlamaCppVisionEngine

__all__ = ["LlamaCppCaptionEngine", "LlamaCppTextEngine", "LlamaCppVisionEngine"]
