"""The Responses API's pieces beside its service (`endpoints/responses.py`): its input as chat
messages and its tool plan (`items`), its output items and semantic events (`output`), and the
store of earlier responses that every ingress replica reaches (`store`)."""
