"""The ingress's side of a batch: how a line calls each endpoint a batch may name (`endpoints`) and
one line run through its endpoint's own service code (`lines`). The endpoints and the batch object
are wire (`deployments.protocol.openai.batches`); the batches are kept in `deployments.state` and
run by `deployments.batch_runner`.
"""
