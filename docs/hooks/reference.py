"""MkDocs hook: the models.yaml reference, generated at build time from the pydantic models that
validate the file, so that the page and the code cannot disagree.

Each section of models.yaml (and the builders' arguments) is a table with one row per field: its
YAML path, type (with its bounds), default and the `Field(description=...)` text. A nested model
gets a table of its own the first time it is reached; later fields of that type link to it.
Only the names that `deployments.config` exports are imported: the modules behind it may move.

`render()` is also what `tests/unit/test_docs_reference.py` checks.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

PAGE = "reference/models-yaml.md"

INTRO = """# models.yaml reference

Generated from the pydantic models in `deployments/config/` when this site is built: every key
that models.yaml and the builders' arguments accept, with its type, default and meaning. The same
models validate the file when the service is built, and refuse unknown keys. How the pieces fit
together, with examples: [Configuration](../configuration.md).
"""


@dataclass
class Section:
    """One table: a model class reached at a YAML path."""

    model: type[BaseModel]
    path: str  # "" for the file level; "models[]", "models[].params", ...
    title: str
    anchor: str
    intro: str = ""
    rows: list[tuple[str, FieldInfo]] = field(default_factory=list)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation refers to (through unions, lists, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _anchor(path: str) -> str:
    return "file" if not path else path.replace("[]", "").replace(".", "-").replace("_", "-")


def sections() -> list[Section]:
    """Every section of models.yaml, then the builder arguments, each model class once."""
    from deployments.config import AppArgs, ModelsFile

    found: list[Section] = []
    seen: dict[type[BaseModel], Section] = {}

    def visit(model: type[BaseModel], path: str, title: str, intro: str = "") -> None:
        section = Section(model, path, title, _anchor(path) if model is not AppArgs else "builder-args", intro)
        seen[model] = section
        found.append(section)
        nested: list[tuple[type[BaseModel], str]] = []
        for name, info in model.model_fields.items():
            key = f"{path}.{name}" if path else name
            section.rows.append((key, info))
            for inner in _models_in(info.annotation):
                if inner not in seen and all(inner is not m for m, _ in nested):
                    is_list = typing.get_origin(info.annotation) is list
                    nested.append((inner, f"{key}[]" if is_list else key))
        for inner, key in nested:
            if inner not in seen:
                visit(inner, key, f"`{key}`")

    visit(ModelsFile, "", "File level", "The top-level keys of models.yaml.")
    visit(
        AppArgs,
        "",
        "Builder arguments",
        "`build_app` and `build_captioner_app` take these, from serve_config.yaml's `args:` or as "
        "`key=value` on the `serve run` command line. Dotted keys nest: `decoder.max_tokens=64` is "
        "`{decoder: {max_tokens: 64}}`.",
    )
    return found


def _literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else str(value)
    return str(value)


def _bounds(metadata: list[Any]) -> str:
    out = []
    for m in metadata:
        if isinstance(m, annotated_types.Gt):
            out.append(f"> {_literal(m.gt)}")
        elif isinstance(m, annotated_types.Ge):
            out.append(f"≥ {_literal(m.ge)}")
        elif isinstance(m, annotated_types.Lt):
            out.append(f"< {_literal(m.lt)}")
        elif isinstance(m, annotated_types.Le):
            out.append(f"≤ {_literal(m.le)}")
        elif isinstance(m, annotated_types.MinLen) and m.min_length:
            out.append(f"at least {m.min_length} long")
    return ", ".join(out)


def type_text(annotation: Any, links: dict[type[BaseModel], Section], page_metadata: Sequence[Any] = ()) -> str:
    """A reader's name for a field's type: `integer > 0 | "all" | null`, `list of string`, a link."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        inner, *extra = args
        metadata = [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
        return type_text(inner, links, metadata)
    bounds = _bounds(list(page_metadata))
    suffix = f" {bounds}" if bounds else ""
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' if isinstance(a, str) else _literal(a) for a in args) + suffix
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a, links, page_metadata) for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("null")
        return " \\| ".join(parts)
    if origin is list:
        item = args[0]
        if isinstance(item, type) and issubclass(item, BaseModel) and item in links:
            return f"list of [entries](#{links[item].anchor})" + suffix
        return f"list of {type_text(item, links)}" + suffix
    if origin is dict:
        return "mapping" + suffix
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        section = links.get(annotation)
        return f"[section](#{section.anchor})" if section else "section"
    names = {int: "integer", float: "number", str: "string", bool: "boolean"}
    if annotation is Any:
        return "any"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation))) + suffix


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "its defaults"
        return f"`{_literal(value)}`" if value not in ([], {}) else f"`{value!r}`"
    value = info.default
    if value is PydanticUndefined:
        return "required"
    text = f"`{_literal(value)}`"
    mib = 1024 * 1024
    if isinstance(value, int) and not isinstance(value, bool) and value >= mib and value % mib == 0:
        text += f" ({value // mib} MiB)"
    return text


def key_html(key: str) -> str:
    """A YAML path as code that may wrap after its dots (and nowhere else: see extra.css)."""
    return "<code>" + key.replace(".", ".<wbr>") + "</code>"


def description(info: FieldInfo) -> str:
    return " ".join((info.description or "").split()).replace("|", "\\|")


def render() -> str:
    found = sections()
    links = {s.model: s for s in found}
    out = [INTRO]
    for section in found:
        out.append(f"## {section.title} {{ #{section.anchor} }}\n")
        doc = section.intro or " ".join((section.model.__doc__ or "").split("\n\n")[0].split()).replace("``", "`")
        if doc:
            out.append(doc + "\n")
        out.append(f"Python: `{section.model.__name__}`.\n")
        out.append('<div class="mmserve-reference" markdown>\n')
        out.append("| key | type | default | description |")
        out.append("| --- | --- | --- | --- |")
        for key, info in section.rows:
            kind = type_text(info.annotation, links, info.metadata)
            out.append(f"| {key_html(key)} | {kind} | {default_text(info)} | {description(info)} |")
        out.append("\n</div>\n")
    return "\n".join(out)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files
