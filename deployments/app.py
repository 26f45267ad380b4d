"""The composition root: the only place that binds deployments.

Two Serve applications, so that a captioner that cannot start (OOM, no weights, no GPU to
schedule on) never takes the main application out of RUNNING:

- `build_app(args)`: Ingress -> one PrimaryDecoder per primary model, one TextEmbedder per
  embedding model, and the BatchRunner of /v1/batches (the main application, HTTP on /)
- `build_captioner_app(args)`: one VisionCaptioner per captioner that a primary names (found by
  the ingress by application and deployment name); two primaries that name the same captioner share it

Both take the same args (see `AppArgs`), so serve_config.yaml can share one `args:` block. Every
deployment's Serve options and name come from `options`, here. With one primary (the default) the
deployments are `PrimaryDecoder` and `VisionCaptioner`; with several, each name carries its model's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ray.serve import Application

from deployments.batch_runner.runner import BatchRunner, BatchRunnerConfig
from deployments.config import AUTO, ModelConfig, cpu_cores, parse_args, resolve_plan
from deployments.config.limits import load_limits_file
from deployments.ingress.deployment import Ingress, IngressConfig, ServedEmbedderConfig, ServedModelConfig
from deployments.options import (
    BATCH_RUNNER_OPTIONS,
    INGRESS_OPTIONS,
    captioner_options,
    decoder_options,
    deployment_name,
    embedder_options,
    for_replicas,
    placed_captioner,
)
from deployments.replicas.captioner import VisionCaptioner
from deployments.replicas.decoder import PrimaryDecoder
from deployments.replicas.embedder import TextEmbedder
from deployments.roles import Role

logger = logging.getLogger("ray.serve")


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Main application: the OpenAI ingress and a decoder per primary model. On CPU the decoders
    share the cores and one Ray CPU equally.
    """
    app_args = parse_args(args)
    plan = resolve_plan(app_args)
    deadline = plan.server.request_timeout_s  # a replacement waits for the requests in flight
    several, share = len(plan.primaries) > 1, len(plan.primaries)
    several_captioners = len(plan.captioners) > 1
    decoders = {}
    served = []
    for model in plan.primaries:
        options, primary = decoder_options(app_args, model, max(1, cpu_cores() // share), 1 / share)
        name = deployment_name(Role.DECODER, primary, several)
        logger.info(
            "building main app: primary=%s engine=%s%s vision=%s deployment=%s options=%s cpu_threads=%s",
            primary.name,
            primary.engine,
            " (auto)" if model.engine == AUTO else "",
            primary.capabilities.vision_mode,
            name,
            options,
            primary.params.cpu_threads,
        )
        options = for_replicas(PrimaryDecoder.name, options, drain_s=deadline)
        decoders[primary.name] = PrimaryDecoder.options(name=name, **options).bind(primary, plan.lifecycle)
        captioner = plan.captioner_of(primary)
        served.append(
            ServedModelConfig(
                name=primary.name,
                captioner=captioner,
                captioner_deployment=deployment_name(Role.CAPTIONER, captioner, several_captioners),
                native_max_images=primary.capabilities.max_images_per_request
                if primary.capabilities.vision_mode == "native"
                else None,
                adapters=list(primary.params.lora.adapters) if primary.params.lora else [],
                dynamic_adapters=primary.params.lora is not None and primary.params.lora.dynamic_path is not None,
                max_tokens=primary.params.max_tokens,
            )
        )
    embedders, embedding = {}, []
    for model in plan.embedders:
        options, placed = embedder_options(app_args, model)
        name = deployment_name(Role.EMBEDDER, placed, len(plan.embedders) > 1)
        logger.info(
            "building main app: embedder=%s engine=%s%s deployment=%s options=%s embedding=%s",
            placed.name,
            placed.engine,
            " (auto)" if model.engine == AUTO else "",
            name,
            options,
            placed.embedding,
        )
        options = for_replicas(TextEmbedder.name, options, drain_s=deadline)
        embedders[placed.name] = TextEmbedder.options(name=name, **options).bind(placed, plan.lifecycle)
        assert placed.embedding is not None  # plan.embedders are the entries with the section
        embedding.append(
            ServedEmbedderConfig(
                name=placed.name,
                max_inputs=placed.embedding.max_inputs_per_request,
                token_ids=placed.embedding.token_ids,
            )
        )
    config = IngressConfig(
        models=served,
        embedders=embedding,
        vision=plan.vision,
        captioner_app=plan.captioner_app,
        images=plan.images,
        documents=plan.documents,
        server=plan.server,
        limits=load_limits_file(app_args.limits_file) if app_args.limits_file else None,
        limits_path=str(Path(app_args.limits_file).resolve()) if app_args.limits_file else None,
    )
    runner = BatchRunner.options(
        name=BatchRunner.name, **for_replicas(BatchRunner.name, BATCH_RUNNER_OPTIONS, drain_s=deadline)
    ).bind(
        BatchRunnerConfig(
            batches=plan.server.batches,
            storage_root=plan.server.state.storage_root,
            chat_models=[m.name for m in served],
            embedding_models=[e.name for e in embedding],
            adapters={m.name: list(m.adapters) for m in served},
            dynamic_adapters=[m.name for m in served if m.dynamic_adapters],
            ingress_deployment=Ingress.name,
            line_timeout_s=deadline + 30,
            max_line_bytes=plan.server.max_body_bytes,
        )
    )
    ingress = Ingress.options(**for_replicas(Ingress.name, INGRESS_OPTIONS, drain_s=deadline))
    return ingress.bind(config, decoders, embedders, runner)


def build_captioner_app(args: dict[str, Any] | None = None) -> Application:
    """Captioner application: a captioner deployment per captioner the primaries name. The first is
    the application's root and holds the others' handles, so that Serve deploys them all. Without
    a proxy-vision captioner configured, one replica that only reports so.
    """
    app_args = parse_args(args)
    plan = resolve_plan(app_args)
    models: list[ModelConfig | None] = [*plan.captioners] or [None]
    first, *rest = models

    def captioner(model: ModelConfig | None, *others: Application) -> Application:
        name = deployment_name(Role.CAPTIONER, model, bool(rest))
        model = None if model is None else placed_captioner(app_args, model)  # auto: by its GPU share
        options = for_replicas(
            VisionCaptioner.name, captioner_options(app_args, model), drain_s=plan.proxy_vision.timeout_s
        )
        return VisionCaptioner.options(name=name, **options).bind(model, plan.lifecycle, *others)

    return captioner(first, *(captioner(model) for model in rest))
