"""vLLM's /tokenize and /detokenize, by the decoder's own tokenizer and chat template."""
