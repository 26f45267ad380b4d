"""Deployment names: the role's, with the model's when the application has several of that role."""

from __future__ import annotations

import re

from deployments.config import ModelConfig
from deployments.roles import Role


def deployment_name(role: Role, model: ModelConfig | None, several: bool) -> str:
    """The role's deployment name alone when the application has one deployment of that role, else
    with the model's name (characters outside ``[A-Za-z0-9._-]`` become ``-``: the name is in
    replica actor and log file names, and Serve reserves ``#``).
    """
    if not several or model is None:
        return role.deployment
    return f"{role.deployment}-{re.sub(r'[^A-Za-z0-9._-]', '-', model.name)}"
