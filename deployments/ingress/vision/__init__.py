"""Proxy vision in the ingress: collect, fetch and check images, caption them (cache, client), rewrite the chat."""
