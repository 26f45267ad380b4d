"""Document input (the file-level ``documents:`` section): what PDF and text documents a request may
carry (chat's `file` parts, Responses' `input_file`, Messages' `document` blocks) and the bounds of
reading them. A document is read in a worker process of the ingress's own (`ingress/documents/`),
under a memory limit and a deadline, so that a hostile PDF costs one 400 and never the ingress.
"""

from __future__ import annotations

from pydantic import Field

from deployments.config.strict import StrictModel


class DocumentInputConfig(StrictModel):
    """Limits of request documents and of the workers that read them."""

    max_document_bytes: int = Field(
        32 * 1024 * 1024, gt=0, description="Largest document, in bytes (OpenAI's and Anthropic's limit); 400 beyond."
    )
    max_documents_per_request: int = Field(16, ge=0, description="Most documents in one request; 400 beyond.")
    max_pages_per_request: int = Field(
        1000, gt=0, description="Most PDF pages in one request, all documents together; 400 beyond."
    )
    max_chars_per_request: int = Field(
        400_000,
        gt=0,
        description="Most characters of document text the model reads in one request, whatever its context (and "
        "what a reading keeps: a text document's parts beyond are counted, not kept; a PDF's pages beyond are not "
        "read). Beyond, whole pages are left out from the end (never half a page); the prompt and the answer's "
        "`vision.unseen_pages` name them (reason truncated).",
    )
    fit_to_context: bool = Field(
        True,
        description="Also leave out whole pages from the end until the prompt leaves the model's default max_tokens "
        "of its context (max_model_len), counted with the model's own tokenizer (the decoder's tokenize; no count "
        "when the chat's bytes surely fit); the first page is always kept, so a 400 context_length_exceeded comes "
        "only when not even it fits. false: max_chars_per_request alone.",
    )
    min_page_chars: int = Field(
        16,
        ge=0,
        description="A PDF page with fewer characters of text is read as an image (a scan, a figure): rendered and "
        "captioned (proxy vision) or shown to a native VLM, within the image limits; without vision it is named "
        "as not seen.",
    )
    render_max_side: int = Field(
        1024, ge=64, le=4096, description="Longest side, in pixels, of a page rendered as an image."
    )
    max_rendered_pages: int = Field(
        16, ge=0, description="Most pages of one document rendered as images; later image-only pages are not seen."
    )
    text_part_chars: int = Field(
        4000,
        gt=0,
        description="A text document (plain text, Markdown, CSV) is read in parts of about this many characters, "
        "split at line ends: its pages, for the prompt's marks and for truncation.",
    )
    workers: int = Field(2, gt=0, description="Worker processes per ingress replica that read PDFs, started on use.")
    max_reads_per_request: int = Field(
        2,
        gt=0,
        description="Most PDFs of one request waiting for a worker or being read at once; its others wait their "
        "turn outside the replica's queue, so that one request can neither fill the queue nor stand in front of "
        "every other request's PDFs.",
    )
    max_queued_reads: int = Field(
        32,
        ge=0,
        description="Most PDFs waiting for a worker in one ingress replica, all requests together. Beyond, the "
        "request is a 503 (code overloaded) with Retry-After, before any of its pages is read.",
    )
    parse_timeout_s: float = Field(
        30.0, gt=0, description="Deadline of reading one PDF; its worker is killed beyond, and the request gets a 400."
    )
    parse_memory_mb: int = Field(
        1024,
        ge=64,
        description="Memory a worker may allocate beyond its start (RLIMIT_AS): a decompression bomb fails there, "
        "as a 400 naming the document.",
    )
    cache_entries: int = Field(
        256, ge=0, description="Documents read kept per ingress replica, keyed by their bytes' SHA-256; 0 disables."
    )
    cache_mb: float = Field(64.0, gt=0, description="Memory bound of the document cache (text and rendered pages), MB.")
