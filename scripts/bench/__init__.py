"""The benchmarks, one tool with a subcommand each (`python -m scripts.bench SUBCOMMAND`, from the
repository root; `--help` after a subcommand gives its flags). Each prints one JSON line per
configuration (docs/benchmarks.md records the runs).

- `serve`: this service (`serve run`) beside a peer (`transformers serve --continuous-batching`,
  or a `llama-server`) on the same model, prompts and machine (`serve.py`);
- `engines`: the decoder engines alone, no Serve (`engines.py`);
- `overhead`: Serve's own cost, one decoder alone and through the service, in one run (`overhead.py`);
- `native`: a native vision-language primary through Serve, at each concurrency (`native.py`);
- `ramp`: decoder autoscaling under a load ramp (`ramp.py`);
- `metrics`: what the metrics and the access log cost a decoder and the ingress (`metrics.py`);
- `structured`: JSON-constrained decoding against free text (`structured.py`);
- `embeddings`: embeddings per second, the engines alone and through Serve, beside
  sentence-transformers' own `encode` (`embeddings.py`);
- `greedy`: greedy answers alone and beside sampled requests, per llama.cpp KV layout, with their
  memory and speed (`greedy.py`);
- `burst`: long prompts at once through a running service: answered, or how each other one ended
  (`burst.py`);
- `prompts`: time to first token and decode speed by prompt and output length, per llama.cpp KV
  layout, through Serve, the engine alone and `llama-server` (`prompts.py`);
- `batch`: a batch job's tokens/s against the same lines from a concurrency-8 client, and interactive
  time to first token beside a running batch (`batch.py`);
- `lines`: reading a batch input file's lines, one 32 MB line and many short ones, against the
  quadratic reader it replaced (`lines.py`);
- `settle`: concurrency-8 tokens/s at `scripts/run.sh`'s ready line and five minutes later
  (`settle.py`);
- `lora`: concurrency-8 tokens/s on the base model and spread over four GGUF LoRA adapters (`lora.py`);
- `fairness`: one key's time to first token while another fills the decoder, per limits setting
  (`fairness.py`);
- `documents`: PDF pages read per second, first read and cache hit (`documents.py`);
- `hops`: Serve's own path over an instant fake decoder, hop by hop, beside a bare Serve application
  (`hops.py`, `bare_serve.py`);
- `wheel`: the xllamacpp wheel (and a build of it on this machine) against `llama-server`, both
  llama.cpp's own HTTP server, nothing of this service between (`wheel.py`);
- `census`: each Ray process's share of the cores, the service idle and streaming (`census.py`);
- `store`: what `store: true` adds to a response, and the responses store's size under its caps
  (`store.py`);
- `sessions`: agent sessions (the whole conversation resent each turn) per decoder layout and router:
  warm turns' cached share and time to first token (`sessions.py`, its client side in `session_client.py`);
- `gpu`: the engine on a GPU against plain `generate` and the bandwidth roofline (`gpu.py`).

What they share sits here too: `common` (servers in their own process group, the models.yaml they
serve, prompts, the closed loop, test images, percentiles) and `tiny_models` (small real models
built offline, also the tests' fixtures). The tests import from here, never the other way.
"""
