"""The CPU ingress: the OpenAI HTTP app (routes, a service per endpoint over one answer core) and the
vision pipeline in front of the model replicas.
"""
