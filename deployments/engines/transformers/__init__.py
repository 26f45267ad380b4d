"""The transformers engines (Hugging Face models, GPUs, and a GGUF when a user names this engine).

`base` holds the set-up, `close` and the token-stream-to-output loop every engine here shares; the
engines are `sequential` and `continuous` (text decoders over `text`), `native` (a VLM as the
primary, with `native_prompt`, `native_batch`, `processor_cache` and `memory_profile`) and
`captioner`. Around them: `loading` (device, dtype, quantization), `progress` (load-progress lines),
`int4_cpu`, `constraints` (logprobs, logit bias and JSON grammars per request), `chat_template`,
`sampling` and `stream`. Imported only when a model names `engine: transformers`.
"""
