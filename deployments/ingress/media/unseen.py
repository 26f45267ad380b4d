"""What the decoder reads in place of an image or a page that nobody described, and why, said once
for the image pipeline and the document stage: an instruction (do not describe it; say it was not
seen), not a bare fact the model may talk around.
"""

from __future__ import annotations

from deployments.protocol.openai.common import PageUnseenReason, UnseenReason

WHY: dict[PageUnseenReason, str] = {
    "vision_disabled": "this model takes no images",
    "over_image_limit": "the request's image limit was reached",
    "not_rendered": "too many pages without text in this document",
    "truncated": "over the request's limit of document text",
    "captioner_unavailable": "the vision model is unavailable",
    "captioner_timeout": "the vision model did not answer in time",
}


def unseen_marker(reason: UnseenReason) -> str:
    """In place of an image the user sent: that there was an image, that it was not seen and why,
    and what to do about it (not describe it; say so).
    """
    return (
        f"[The user attached an image here, but it could not be seen ({WHY[reason]}). "
        "Do not describe it or guess what it shows; tell the user you cannot see it.]"
    )


def unseen_page_marker(reason: PageUnseenReason) -> str:
    """In place of a document's page without text whose image was not seen."""
    return (
        f"[This page has no text layer, and it could not be seen ({WHY[reason]}). "
        "Do not guess what it shows; tell the user if asked about it.]"
    )
