"""The four roles a deployment plays, named once for the whole service: the ingress (HTTP, the
router), the primary decoder, the vision captioner and the text embedder. A role's value names it in logs and
load-progress lines; `deployment` is its Serve deployment's name (with several primaries or
captioners, each deployment adds its model's name: `options.deployment_name`).
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """A role a deployment plays; its value names it in logs."""

    INGRESS = "ingress"
    DECODER = "decoder"
    CAPTIONER = "captioner"
    EMBEDDER = "embedder"

    @property
    def deployment(self) -> str:
        return _DEPLOYMENTS[self]


_DEPLOYMENTS = {
    Role.INGRESS: "Ingress",
    Role.DECODER: "PrimaryDecoder",
    Role.CAPTIONER: "VisionCaptioner",
    Role.EMBEDDER: "TextEmbedder",
}
