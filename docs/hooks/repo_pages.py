"""MkDocs hook: the repository's README.md is the site's home page and CHANGELOG.md its changelog,
so that neither is kept twice. Their links are written for the repository's root (`docs/api.md`);
on the site they are rewritten to the pages' own paths (`api.md`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"}
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def site_links(markdown: str) -> str:
    """Links from the repository root made relative to the docs folder."""

    def rewrite(match: re.Match[str]) -> str:
        target = match["target"]
        if target.startswith("docs/"):
            target = target.removeprefix("docs/")
        else:
            path, _, fragment = target.partition("#")
            if path in PAGES:
                target = PAGES[path] + (f"#{fragment}" if fragment else "")
        return f"]({target})"

    return LINK.sub(rewrite, markdown)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for source, page in PAGES.items():
        files.append(File.generated(config, page, content=site_links((ROOT / source).read_text())))
    return files
