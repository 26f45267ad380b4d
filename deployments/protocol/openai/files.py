"""/v1/files' wire: OpenAI's file object (what a stored file's record keeps), its list, the deletion's
answer and the upload's form as the OpenAPI schema declares it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

UploadPurpose = Literal["batch", "user_data"]
EXPIRES_ANCHOR, EXPIRES_SECONDS = "expires_after[anchor]", "expires_after[seconds]"  # as OpenAI's clients send them

UPLOAD_FORM: dict[str, Any] = {  # the upload's form, for the OpenAPI schema (the route reads the body itself)
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch", "user_data"]},
                        # With `expires_after[anchor]: created_at` (the only anchor, so it may be left out; not
                        # declared alone here: an anchor without its seconds is a 400).
                        EXPIRES_SECONDS: {
                            "type": "integer",
                            "minimum": 3600,
                            "maximum": 2592000,
                            "description": "The file expires this many seconds after expires_after[anchor] "
                            "(created_at, the only anchor; it may be left out).",
                        },
                    },
                }
            }
        },
    }
}


class FileObject(BaseModel):
    """OpenAI's file object: what a file's record keeps and /v1/files answers."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    """A page of the caller's files."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    """A deletion's answer."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
