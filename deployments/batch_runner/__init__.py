"""The batch runner: the Serve deployment of its own that runs /v1/batches' lines (`runner`), a
batch at a time (`job`), from its input file (`input_lines`, checked by `validation`) to its output
and error files, resuming where it stopped (`progress`). It reads and writes the stored state
(`deployments.state`) and sends each line to the ingress (`ingress/batches/lines.py`).
"""
