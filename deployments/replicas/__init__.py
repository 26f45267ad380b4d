"""The model replicas (GPU or CPU): the decoder and the captioner deployments and what runs inside them."""
