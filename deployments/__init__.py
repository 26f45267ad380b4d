"""mmserve: an OpenAI-compatible multimodal inference service on Ray Serve.

Modules: `app` (composition root), `ingress`, `decoder`, `captioner` (one per deployment),
`config` (models.yaml), `protocol` (wire schema), `errors`, `proxy_vision`, `images`, `engines/`.
"""
