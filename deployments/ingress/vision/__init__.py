"""Vision in the ingress: the pipeline that turns a request's images into what the decoder gets
(`pipeline`), and its steps: collect, fetch and check images, caption them (cache, client), rewrite
the chat (proxy vision) or place the images' slots (native)."""
