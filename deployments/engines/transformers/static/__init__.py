"""The static-slot decoder (`batching: static`): a static KV cache of slots behind transformers'
`AttentionInterface` (`slot_cache`), the shapes its steps run at (`buckets`), the device side with
its CUDA graphs (`decoder`) and the engine's host loop (`engine`).
"""
