"""The CPU ingress: the OpenAI HTTP app and the proxy-vision pipeline in front of the model replicas."""
