"""Vision in the ingress: the pipeline that turns a request's images into what the decoder gets
(`pipeline`), and its steps: collect and check images, caption them (cache, client) or place the
images' slots (native). Fetching, data URLs and the chat's rewrite to text are `media`'s.
"""
