"""Ingress: the OpenAI-compatible HTTP router (CPU), as a Serve deployment.

Its constructor builds each served model's answer core from its config and its decoder's handle
(`AnswerCore`, with its `VisionPipeline` and the `CaptionerClient` of proxy vision, one per
captioner: models that name the same captioner share its client and caption cache; every model
shares the replica's `DocumentStage`: its PDF workers and document cache) and its
`HealthService`; Serve then asks it for its ASGI app (`__serve_build_asgi_app__`), which `api.build_api`
makes for this replica's settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import ray
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.config import (
    DocumentInputConfig,
    ImageInputConfig,
    ModelConfig,
    ProxyVisionConfig,
    ServerConfig,
    TokenIdVocabulary,
)
from deployments.config.limits import LimitsFile
from deployments.ingress.answer.core import AnswerCore
from deployments.ingress.api import build_api
from deployments.ingress.apis.counting import ROUTES
from deployments.ingress.batches.lines import run_line
from deployments.ingress.documents.fit import ContextFit, decoder_count
from deployments.ingress.documents.stage import DocumentStage
from deployments.ingress.embedding.core import EmbeddingCore
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.limits.board import LimitsBoard
from deployments.ingress.limits.estimate import Estimator, StoreSizes
from deployments.ingress.limits.limiter import Limiter
from deployments.ingress.limits.table import KeyTable
from deployments.ingress.served_models import AdapterView, ServedEmbedder, ServedModel, ServedModels
from deployments.ingress.vision.client import CaptionerClient
from deployments.ingress.vision.pipeline import VisionPipeline
from deployments.monitoring.metrics import INGRESS_METRICS, Recorder
from deployments.protocol.openai.models import ModelCard
from deployments.roles import Role
from deployments.state.batches import BatchStore, KeyName
from deployments.state.conversations import ConversationStore
from deployments.state.records import stored_owners
from deployments.state.responses import StoredResponses
from deployments.state.storage import LocalStorage, Storage, open_storage

logger = logging.getLogger("ray.serve")


class ServedModelConfig(BaseModel):
    """One model behind the endpoint: its name, and its captioner under proxy vision."""

    model_config = ConfigDict(extra="forbid")

    name: str
    captioner: ModelConfig | None = None
    captioner_deployment: str = Role.CAPTIONER.deployment  # the captioner's deployment in `IngressConfig.captioner_app`
    native_max_images: int | None = None  # native vision: the model's own image limit
    adapters: list[str] = []  # its listed LoRA adapters (`params.lora.adapters`)
    dynamic_adapters: bool = False  # any other adapter may be named as '<model>:<adapter>' (`lora.dynamic_path`)
    max_tokens: int = 256  # its completion length when a request sets none (`params.max_tokens`)


class ServedEmbedderConfig(BaseModel):
    """An embedding model behind /v1/embeddings: its name, its per-request input limit and the
    vocabulary its token-id inputs are read in.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    max_inputs: int
    token_ids: TokenIdVocabulary = "model"


class IngressConfig(BaseModel):
    """What the builder hands the ingress: the served models and embedders, how to reach the captioners, the
    input and server settings, and the limits file.
    """

    model_config = ConfigDict(extra="forbid")

    models: list[ServedModelConfig]  # the first is the default model
    embedders: list[ServedEmbedderConfig] = []
    vision: ProxyVisionConfig | None = None  # how to call the captioners
    captioner_app: str = "vision"
    images: ImageInputConfig = ImageInputConfig()
    documents: DocumentInputConfig = DocumentInputConfig()
    server: ServerConfig = ServerConfig()
    limits: LimitsFile | None = None  # the limits file as the builder read it (None: no limits)
    limits_path: str | None = None  # where it is, to see its edits


def adapter_view(
    model: ServedModelConfig, decoder: DeploymentHandle, vision: VisionPipeline, server: ServerConfig
) -> AdapterView | None:
    """How `model`'s LoRA adapters are served: an answer core per adapter over the decoder's handle
    with the adapter as Serve's multiplexed model id (Serve routes it to a replica that holds it).
    """
    if not model.adapters and not model.dynamic_adapters:
        return None

    def core(adapter: str) -> AnswerCore:
        return AnswerCore(
            decoder.options(multiplexed_model_id=adapter),
            vision,
            model_name=f"{model.name}:{adapter}",
            request_timeout_s=server.request_timeout_s,
            max_n=server.max_n,
        )

    return AdapterView(tuple(model.adapters), model.dynamic_adapters, core)


@serve.deployment  # its options are the builder's (deployments/options/)
@serve.ingress()
class Ingress:
    """The ingress deployment: the HTTP API of every served model, over the model deployments' handles."""

    def __init__(
        self,
        config: IngressConfig,
        decoders: dict[str, DeploymentHandle],
        embedders: dict[str, DeploymentHandle] | None = None,
        batch_runner: DeploymentHandle | None = None,
    ) -> None:
        """`decoders`: each served model's decoder handle, by model name; `embedders`: each embedding
        model's handle, by model name; `batch_runner`: the runner of /v1/batches (None: no Files and
        Batch APIs).
        """
        self._metrics = Recorder(INGRESS_METRICS, config.models[0].name)
        server = config.server
        clients: dict[str, CaptionerClient] = {}
        documents = DocumentStage(config.documents, config.images, metrics=self._metrics)  # one per replica
        served = []
        for model in config.models:
            captioner = None
            if model.captioner is not None and config.vision is not None:
                captioner = clients.get(model.captioner.name) or CaptionerClient(
                    config.captioner_app, model.captioner, config.vision, self._metrics, model.captioner_deployment
                )
                clients[model.captioner.name] = captioner
            decoder = decoders[model.name]
            vision = VisionPipeline(
                captioner,
                model_name=model.name,
                images=config.images,
                vision=config.vision,
                native_max_images=model.native_max_images,
                documents=documents,
                document_fit=ContextFit(decoder_count(decoder), model.max_tokens),
            )
            core = AnswerCore(
                decoder, vision, model_name=model.name, request_timeout_s=server.request_timeout_s, max_n=server.max_n
            )
            health = HealthService(decoder, captioner, model_name=model.name)
            card = ModelCard(id=model.name, created=int(time.time()))
            served.append(ServedModel(card, core, health, adapter_view(model, decoder, vision, server)))
        embedding = [
            ServedEmbedder(
                ModelCard(id=e.name, created=int(time.time())),
                EmbeddingCore(
                    (embedders or {})[e.name],
                    model_name=e.name,
                    max_inputs=e.max_inputs,
                    token_ids=e.token_ids,
                    request_timeout_s=server.request_timeout_s,
                ),
            )
            for e in config.embedders
        ]
        self._served = ServedModels(served, embedding)
        app = serve.get_replica_context().app_name
        self._limiter: Limiter | None = None
        table = None
        if config.limits is not None:
            table = KeyTable(config.limits, config.limits_path)
            board = LimitsBoard(f"mmserve-limits-{app}", lease_s=server.request_timeout_s + 60)
            board.start()
            self._limiter = Limiter(
                table,
                board,
                served=self._served,
                default_max_tokens={m.name: m.max_tokens for m in config.models},
                metrics=self._metrics,
                routes=ROUTES,  # how each API's routes are counted, as the APIs declare it
            )
        self._guard = GuardSettings.from_config(server, extra_keys=table)  # the limits file's named keys too
        storage = open_storage(server.state.storage_root)  # what outlives a request: one root, one owners' secret
        owners = stored_owners(storage)
        _say_if_local_on_a_cluster(storage)
        self._responses = StoredResponses(
            storage, owners, server.state.responses_max_bytes, server.state.responses_max_age_s
        )
        self._conversations = ConversationStore(
            storage,
            owners,
            server.state.conversation_max_bytes,
            server.state.conversations_max_per_key,
            server.state.conversations_max_bytes_per_key,
        )
        self._batch_runner = batch_runner
        self._batch_keys: dict[str, KeyName] = {}  # with limits, the key each batch's lines count against
        self._batches: BatchStore | None = None
        if batch_runner is not None:
            self._batches = BatchStore.open(server.batches, storage, owners)
            documents.files = self._batches.files  # documents named by file_id
        if self._limiter is not None:  # what a request names in the stores counts in its estimate
            files = self._batches.files if self._batches is not None else None
            sizes = StoreSizes(files, self._responses, self._conversations)
            estimator = Estimator(sizes, config.documents.max_chars_per_request)
            self._limiter = dataclasses.replace(self._limiter, estimator=estimator)
        logger.info(
            "ingress for %s: %s, body cap %d bytes, request deadline %gs",
            ", ".join(repr(name) for name in [*(m.name for m in config.models), *(e.name for e in config.embedders)]),
            f"{len(self._guard.keys) + len(table.digests if table else [])} API key(s) required"
            if self._guard.required
            else "no API keys (open)",
            server.max_body_bytes,
            server.request_timeout_s,
        )

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_api(
            self._served,
            self._guard,
            self._metrics,
            self._responses,
            self._batches,
            self._wake_runner,
            self._limiter,
            self._conversations,
        )

    def _wake_runner(self) -> None:
        if self._batch_runner is not None:
            self._batch_runner.wake.remote()  # not awaited: the runner also looks every poll interval

    async def batch_line(self, batch_id: str, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        """One line of a batch, for the batch runner's handle: the endpoint's answer through the same
        service code as its HTTP route, as `{"status_code", "body"}` (`ingress/batches/lines.py`); with
        limits, against the budget of the key that made the batch.
        """
        limits = None
        if self._limiter is not None and self._batches is not None:
            key = self._batch_keys.get(batch_id) or await asyncio.to_thread(self._batches.key, batch_id)
            if key is not None:
                self._batch_keys[batch_id] = key
                limits = (self._limiter, self._limiter.table.named(*key))
        return await run_line(self._served, batch_id, endpoint, body, request_id, limits)


def _say_if_local_on_a_cluster(storage: Storage) -> None:
    """A local storage root on a cluster of several nodes: each node's replicas keep their own state
    unless every node mounts that path (a warning, once per replica).
    """
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    if isinstance(storage, LocalStorage) and nodes > 1:
        logger.warning(
            "storage root %s is a local path on a cluster of %d nodes: unless every node mounts it, each node's "
            "replicas keep files, batches, stored responses and conversations of their own "
            "(server.state.storage_root: a shared mount or an object-store URI)",
            storage.root,
            nodes,
        )
