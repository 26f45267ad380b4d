"""The LoRA adapters of one decoder replica, routed by Serve's model multiplexing.

The ingress calls the decoder with ``handle.options(multiplexed_model_id=<adapter>)``; Serve routes
the call to a replica that holds that adapter when one does (else any, which loads it), and the
replica reads the id with ``serve.get_multiplexed_model_id()``. `ReplicaAdapters.acquire` loads it
through a loader wrapped in ``serve.multiplexed(max_num_models_per_replica=...)``: Serve keeps the
replica's adapters in an LRU of that size and tells the router which ones each replica holds.

When Serve evicts an adapter it calls the evicted lease's ``__del__``: the adapter is dropped from
the engine at once, or, while requests still run on it, when the last of them ends (an eviction
never changes a running answer). An adapter that cannot be found is a 404 (`ModelNotFoundError`),
one that cannot be loaded a 400 naming it (`InvalidRequestError`); neither changes what is held.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from ray import serve

from deployments.config import LoraConfig, ModelConfig
from deployments.config.lora import AdapterError, AdapterMissing, adapter_path, check_adapter, is_uri, local_copy
from deployments.engines import TextEngine
from deployments.errors import InvalidRequestError, ModelNotFoundError
from deployments.monitoring.metrics import Recorder

logger = logging.getLogger("ray.serve")


class _Lease:
    """What Serve's multiplexing keeps for a loaded adapter; its ``__del__`` (Serve calls it on
    eviction, in a worker thread) retires the adapter, once.
    """

    def __init__(self, owner: ReplicaAdapters, name: str) -> None:
        self._owner, self.name, self._done = owner, name, False

    def __del__(self) -> None:
        if not self._done:
            self._done = True
            self._owner.retire(self.name)


class ReplicaAdapters:
    """Loads, counts and drops the adapters of `model` (its `params.lora`) on the replica's engine."""

    def __init__(
        self, model: ModelConfig, lora: LoraConfig, engine: Callable[[], TextEngine | None], metrics: Recorder
    ):
        """`engine`: the replica's engine now (None while it is not loaded)."""
        self._model, self._lora, self._engine, self._metrics = model, lora, engine, metrics
        self._base = model.hf_id or model.local_path or model.name
        self._lock = threading.Lock()
        self._users: Counter[str] = Counter()  # running requests per adapter
        self._retired: set[str] = set()  # evicted by Serve while requests still ran on it
        self.held: set[str] = set()  # loaded on the engine
        self._dropping: dict[str, asyncio.Future[None]] = {}  # being dropped from the engine now

        async def load(name: str) -> _Lease:
            return await self._load(name)

        self._multiplexed: Callable[[str], Awaitable[_Lease]] = serve.multiplexed(
            max_num_models_per_replica=lora.max_adapters_per_replica
        )(load)

    async def acquire(self, name: str) -> None:
        """Adapter `name` loaded (through Serve's LRU) and counted as in use until `release`."""
        if name not in self.held:
            # Found and loadable before Serve's LRU makes room for it: a name that cannot be loaded
            # never evicts a held adapter.
            await self._checked(name)
        # Shielded: a client gone mid-load leaves the load to finish and be counted (else the
        # engine would hold an adapter that neither Serve's LRU nor `held` knows).
        await asyncio.shield(self._multiplexed(name))
        with self._lock:  # no await since the load returned: Serve cannot have evicted it meanwhile
            self._users[name] += 1
            self._retired.discard(name)

    async def release(self, name: str) -> None:
        with self._lock:
            self._users[name] -= 1
            drop = self._users[name] <= 0 and name in self._retired
            if self._users[name] <= 0:
                del self._users[name]
            if drop:
                self._retired.discard(name)
                self.held.discard(name)  # a request for it from now on loads it anew, once this drop is done
        if drop:
            dropping = self._dropping[name] = asyncio.ensure_future(asyncio.to_thread(self._drop, name))
            try:
                await dropping
            finally:
                if self._dropping.get(name) is dropping:
                    del self._dropping[name]

    def retire(self, name: str) -> None:
        """Serve evicted `name`: drop it now, or when its last running request ends. Blocking."""
        with self._lock:
            if self._users[name] > 0:
                self._retired.add(name)
                logger.info(
                    "model %s: LoRA adapter %s evicted; dropped when its running requests end", self._model.name, name
                )
                return
        self._unload(name)

    def _unload(self, name: str) -> None:
        with self._lock:
            held = name in self.held
            self.held.discard(name)
        if held:
            self._drop(name)

    def _drop(self, name: str) -> None:
        engine = self._engine()
        if engine is not None:
            engine.unload_adapter(name)
        logger.info("model %s: LoRA adapter %s dropped (%d held)", self._model.name, name, len(self.held))

    async def _checked(self, name: str) -> str:
        """Where adapter `name` is, found and checked (config, rank, base); else the 404 or the 400,
        counted and logged.
        """
        path = None
        try:
            path = adapter_path(self._lora, name)
            if path is None:
                raise AdapterMissing("no lora.dynamic_path to look it up in")
            await asyncio.to_thread(check_adapter, path, self._lora, self._base)
            return path
        except AdapterMissing as exc:
            self._metrics.inc("lora_adapter_loads", tags={"outcome": "not_found"})
            logger.warning("model %s: LoRA adapter %s not found: %s", self._model.name, name, exc)
            raise ModelNotFoundError(
                f"The model '{self._model.name}:{name}' does not exist: no LoRA adapter {name!r}.", param="model"
            ) from None
        except (AdapterError, OSError) as exc:
            raise self._failed(name, exc, path) from None

    def _failed(self, name: str, exc: Exception, *places: object) -> InvalidRequestError:
        """The 400 for an adapter that cannot be loaded: the log line has the whole cause, the client's
        answer never the adapter's location (`places`: its path or storage URI, its local copy).
        """
        self._metrics.inc("lora_adapter_loads", tags={"outcome": "failed"})
        logger.warning("model %s: LoRA adapter %s cannot be loaded: %s", self._model.name, name, exc)
        if isinstance(exc, InvalidRequestError):
            text = exc.message
        else:
            why = str(exc) if isinstance(exc, AdapterError) else "its files cannot be read"
            text = f"The LoRA adapter {name!r} cannot be loaded: {why}"
        for place in places:
            if place:
                text = text.replace(str(place), "the adapter")
        return InvalidRequestError(text, param="model")

    async def _load(self, name: str) -> _Lease:
        if (dropping := self._dropping.get(name)) is not None:  # dropped a moment ago: load it after that
            await asyncio.shield(dropping)
        if name in self.held:  # evicted while in use, asked for again before it was dropped
            return _Lease(self, name)
        start = time.monotonic()
        path = await self._checked(name)
        folder = None
        try:
            folder = await asyncio.to_thread(local_copy, path)
            engine = self._engine()
            if engine is None:
                raise InvalidRequestError(f"The LoRA adapter {name!r} cannot be loaded: the model is not loaded")
            await asyncio.to_thread(engine.load_adapter, name, str(folder))
        except (OSError, InvalidRequestError) as exc:
            raise self._failed(name, exc, path, folder) from None
        finally:
            if folder is not None and is_uri(path):  # the URI's temporary copy: read by now
                await asyncio.to_thread(shutil.rmtree, folder, True)
        seconds = time.monotonic() - start
        self.held.add(name)
        self._metrics.inc("lora_adapter_loads", tags={"outcome": "loaded"})
        self._metrics.observe("lora_adapter_load_seconds", seconds)
        logger.info(
            "model %s: LoRA adapter %s loaded from %s in %.2fs (%d held)",
            self._model.name,
            name,
            path,
            seconds,
            len(self.held),
        )
        return _Lease(self, name)
