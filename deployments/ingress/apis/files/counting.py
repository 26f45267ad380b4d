"""How the keys' limits count the Files API (`limits.counting`): not at all; a key's files are
bounded by their own quotas (`batches.max_files_per_key`, `max_bytes_per_key`), and an upload
streams on to storage unread by the limits.
"""

from deployments.ingress.limits.counting import Counted, RouteCounting

COUNTING = (
    RouteCounting("POST", "/v1/files", Counted.UNCOUNTED),
    RouteCounting("DELETE", "/v1/files/{file_id}", Counted.UNCOUNTED),
)
