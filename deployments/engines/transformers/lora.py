"""LoRA adapters on a transformers decoder, through PEFT: loaded into the model's own modules (PEFT
replaces each targeted linear layer with a LoRA layer in place, so every engine's forward, ours or
`generate`'s, runs them), and applied per batch row: a step's rows name their adapters
(``__base__`` for the base model) and PEFT's forward hooks give each row its own adapter in the
same forward (`adapter_names`, its mixed-batch path).

Thread safety: loading and dropping adapters change the model's modules, so they and every forward
that uses adapters take one lock (`rows`); the engines' forwards run in their own threads, a load in
a worker thread of the replica's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from deployments.errors import InvalidRequestError

logger = logging.getLogger("ray.serve")

BASE = "__base__"  # PEFT's name for a row without an adapter


def peft_name(name: str) -> str:
    """The adapter's name inside PEFT: ours may hold a '.' (a module name cannot) or be part of
    PEFT's "lora_" prefix (which PEFT warns may reinitialize the weights on load), so one of its own.
    """
    return "adapter_" + name.encode().hex()


class LoraAdapters:
    """The adapters loaded on `model` (a transformers causal LM, changed in place)."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._peft: Any = None  # the PeftModel around `model`, once an adapter was loaded
        self._lock = threading.RLock()
        self.loaded: set[str] = set()

    def load(self, name: str, folder: str) -> None:
        """Adapter `name` from its PEFT folder; `InvalidRequestError` naming it when it does not fit
        the model (another base's shapes, modules the model lacks, corrupt weights).
        """
        from peft import PeftConfig, PeftModel

        with self._lock:
            if name in self.loaded:
                return
            try:
                if self._peft is None:
                    # PeftModel.from_pretrained's two steps, apart: the wrapper (LoRA layers injected in
                    # place) is kept before the weights are read, so that a failed read is undone.
                    config = PeftConfig.from_pretrained(folder)
                    config.inference_mode = True
                    self._peft = PeftModel(self._model, config, adapter_name=peft_name(name)).eval()
                self._peft.load_adapter(folder, adapter_name=peft_name(name), is_trainable=False)
            except Exception as exc:
                self._discard(name)
                raise InvalidRequestError(f"The LoRA adapter {name!r} cannot be loaded: {exc}", param="model") from exc
            self._peft.eval()
            self.loaded.add(name)
            logger.info("LoRA adapter %s loaded from %s", name, folder)

    def _discard(self, name: str) -> None:
        """Whatever a failed load left of `name` removed, so that the model is as it was."""
        if self._peft is not None and peft_name(name) in self._peft.peft_config:
            with contextlib.suppress(Exception):
                self._peft.delete_adapter(peft_name(name))

    def unload(self, name: str) -> None:
        with self._lock:
            if name not in self.loaded:
                return
            self._peft.delete_adapter(peft_name(name))
            self.loaded.discard(name)
            logger.info("LoRA adapter %s unloaded", name)

    @contextlib.contextmanager
    def rows(self, adapters: Sequence[str | None]) -> Iterator[None]:
        """A forward of rows with these adapters (None: the base model), one per batch row. Once any
        adapter was loaded, every forward names its rows' adapters: PEFT's layers would otherwise
        apply their active adapter to every row.
        """
        with self._lock:
            if self._peft is None:
                yield
                return
            if unknown := {a for a in adapters if a is not None} - self.loaded:
                raise InvalidRequestError(f"LoRA adapter(s) not loaded: {sorted(unknown)}", param="model")
            names = [BASE if a is None else peft_name(a) for a in adapters]
            with self._peft.base_model._enable_peft_forward_hooks(adapter_names=names):
                yield
