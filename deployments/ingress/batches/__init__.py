"""The ingress's side of a batch: the endpoints a line may call (`endpoints`) and one line run through
its endpoint's own service code (`lines`). The batches themselves are kept in `deployments.state`
and run by `deployments.batch_runner`."""
