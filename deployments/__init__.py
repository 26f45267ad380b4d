"""mmserve: an OpenAI-compatible multimodal inference service on Ray Serve.

Packages are named for where their code runs (the ingress process, the model replicas, the builder);
what each package and top-level module holds is the package map in docs/architecture.md.
"""
