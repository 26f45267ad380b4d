"""What /v1/files and /v1/batches share (their routes and wire are in `apis/files/` and `apis/batches/`):
the storage root (`storage`), a batch input file's lines (`input_lines`), owned records (`records`),
the file store (`files`), the batch store (`store`), a batch file's validation (`validation`), one
line through an endpoint's own service code (`lines`), a batch's progress (`progress`) and the
`BatchRunner` deployment (`runner`)."""
