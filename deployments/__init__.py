"""mmserve: an OpenAI-compatible multimodal inference service on Ray Serve.

Packages are named for where their code runs:

- `ingress/` (the CPU router process): the FastAPI app, the chat and health logic (and `ports`,
  what they call on the decoder and the captioner), the request guard, and the proxy-vision
  pipeline (`ingress/vision/`). It never imports torch.
- `replicas/` (the model replica processes, GPU or CPU): the decoder and captioner deployments,
  the captioner's batcher, stop strings, and each engine's lifecycle (`EngineSlot`).
- `engines/` (inside a replica): the engine ABCs, the factory, the transformers engines, a fake.
- `config/` (everywhere, read once at build time): models.yaml's schema and its loading.
- `app.py` and `options.py` (the process that builds the applications): the composition root and
  every deployment's Serve options. `errors.py` and `protocol.py` are shared by all.
- `testing/`: tiny models and benchmark servers for tests and scripts; never imported by the service.
"""
