"""Loading logs its steps to `ray.serve` (source, download, load, quantize, done) with times and bytes,
through the real loading code: tiny local models, a tiny model in a hub cache, and a download."""

import hashlib
import logging
import re
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

from deployments.config import EngineParams, ModelConfig
from deployments.engines import create_caption_engine, create_text_engine
from deployments.engines.transformers import int4_cpu
from deployments.engines.transformers.progress import LoadProgress, module_bytes, tree_size

NEEDS_INT4 = pytest.mark.skipif(not int4_cpu.available(), reason="this torch has no CPU int4 kernel")
SECONDS = r"(\d+\.\d) s"
MB = r"(\d+\.\d) MB"
DONE = rf"done in {SECONDS} \(rss (\d+\.\d [MG]B)\)"


@pytest.fixture
def load_log(caplog: pytest.LogCaptureFixture):
    """The `ray.serve` lines of the loads in a test (Ray's logger does not propagate to the root)."""
    logger = logging.getLogger("ray.serve")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="ray.serve"):
            yield lambda: [r for r in caplog.records if r.name == "ray.serve" and r.getMessage().startswith("loading ")]
    finally:
        logger.removeHandler(caplog.handler)


def match_steps(records: list[logging.LogRecord], prefix: str, patterns: list[str]) -> list[re.Match]:
    """Each line matches its pattern, in this order, and nothing else was logged about the load."""
    lines = [r.getMessage() for r in records]
    assert len(lines) == len(patterns), lines
    assert all(r.levelno == logging.INFO for r in records)
    matches = [re.fullmatch(f"{re.escape(prefix)}: {p}", line) for p, line in zip(patterns, lines, strict=True)]
    assert all(matches), list(zip(patterns, lines, strict=True))
    return matches  # type: ignore[return-value]


def mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


@pytest.mark.parametrize(
    "batching, quantization",
    [("sequential", "none"), pytest.param("continuous", "int4-cpu", marks=NEEDS_INT4)],
)
def test_a_text_engine_logs_each_step_with_time_and_bytes(load_log, tiny_llm_dir, batching, quantization):
    params = EngineParams(batching=batching, quantization=quantization, max_num_seqs=2)
    engine = create_text_engine(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params=params))
    try:
        on_disk, files = tree_size(tiny_llm_dir)
        patterns = [
            rf"source local directory {re.escape(str(tiny_llm_dir))} \({mb(on_disk)} MB in {files} files\)",
            rf"step=download 0\.0 s \(local, {mb(on_disk)} MB on disk\)",
            rf"step=load {SECONDS} \(tokenizer {SECONDS}, model {SECONDS}; {MB} of weights, float32 on cpu\)",
        ]
        if quantization == "int4-cpu":
            patterns.append(rf"step=quantize {SECONDS} \(int4-cpu, {engine.int4_layers} layers; weights {MB} -> {MB}\)")
        patterns.append(DONE)
        steps = match_steps(load_log(), "loading decoder 'tiny'", patterns)
        load = steps[2]
        assert float(load[2]) + float(load[3]) <= float(load[1]) + 0.15
        if quantization == "int4-cpu":
            quantize = steps[3]
            assert float(quantize[3]) == pytest.approx(module_bytes(engine.model) / 1e6, abs=0.05)
            assert float(quantize[3]) < float(quantize[2]) == float(load[4])
        else:
            assert float(load[4]) == pytest.approx(module_bytes(engine.model) / 1e6, abs=0.05)
        assert float(steps[-1][1]) >= float(load[1])
    finally:
        engine.close()


def test_the_vision_engine_logs_each_step_with_time_and_bytes(load_log, tiny_vlm_dir):
    engine = create_caption_engine(ModelConfig(name="tiny-vlm", local_path=str(tiny_vlm_dir)))
    try:
        on_disk, files = tree_size(tiny_vlm_dir)
        _, _, load, _ = match_steps(
            load_log(),
            "loading captioner 'tiny-vlm'",
            [
                rf"source local directory {re.escape(str(tiny_vlm_dir))} \({mb(on_disk)} MB in {files} files\)",
                rf"step=download 0\.0 s \(local, {mb(on_disk)} MB on disk\)",
                rf"step=load {SECONDS} \(processor {SECONDS}, model {SECONDS}; {MB} of weights, float32 on cpu\)",
                DONE,
            ],
        )
        assert float(load[4]) == pytest.approx(module_bytes(engine.model) / 1e6, abs=0.05)
    finally:
        engine.close()


def put_in_hub_cache(cache: Path, repo: str, files: Path) -> Path:
    """`files` laid out as the hub cache holds a download of `repo`: blobs, refs/main, a snapshot of links."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "blobs").mkdir(parents=True)
    (folder / "refs").mkdir()
    commit = "0" * 40
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for path in files.iterdir():
        blob = folder / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(blob)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # loads from the cache without asking the hub
    return tmp_path


def test_a_hub_model_in_the_cache_is_cached(load_log, hub_cache, tiny_llm_dir):
    snapshot = put_in_hub_cache(hub_cache, "mmserve-test/tiny", tiny_llm_dir)
    params = EngineParams(batching="sequential")
    engine = create_text_engine(ModelConfig(name="tiny-hub", hf_id="mmserve-test/tiny", params=params))
    engine.close()
    size = mb(tree_size(snapshot)[0])
    match_steps(
        load_log(),
        "loading decoder 'tiny-hub'",
        [
            rf"source hub mmserve-test/tiny \(hub cache: {size} MB in {re.escape(str(snapshot))}\)",
            rf"step=download 0\.0 s \(cached, {size} MB in the hub cache\)",
            rf"step=load {SECONDS} \(tokenizer {SECONDS}, model {SECONDS}; {MB} of weights, float32 on cpu\)",
            DONE,
        ],
    )


def test_a_download_inside_from_pretrained_is_timed_apart_from_the_load(load_log, hub_cache, tiny_llm_dir):
    """The blobs a call writes are its download, timed to the last one written; the rest is load."""
    model = ModelConfig(name="fetched", hf_id="mmserve-test/fetched")
    progress = LoadProgress("decoder", model)
    loaded = torch.nn.Linear(1000, 1000)

    def fetch_then_load() -> str:  # what `from_pretrained` does with a hub id it has not cached
        time.sleep(0.3)
        put_in_hub_cache(hub_cache, "mmserve-test/fetched", tiny_llm_dir)
        time.sleep(0.5)
        return "loaded"

    assert progress.pretrained("model", fetch_then_load) == "loaded"
    progress.loaded(loaded, {})
    _, download, load = match_steps(
        load_log(),
        "loading decoder 'fetched'",
        [
            rf"source hub mmserve-test/fetched \(not in the hub cache {re.escape(str(hub_cache))}\)",
            rf"step=download {SECONDS} \(fetched {MB} in (\d+) files from the hub inside from_pretrained, "
            rf"timed to the last file written; {MB} in the hub cache now\)",
            rf"step=load {SECONDS} \(model {SECONDS}; 4\.0 MB of weights, float32 on cpu\)",
        ],
    )
    blobs = list((hub_cache / "models--mmserve-test--fetched" / "blobs").iterdir())
    fetched = mb(sum(b.stat().st_size for b in blobs))
    assert (download[2], int(download[3]), download[4]) == (fetched, len(blobs), fetched)
    assert 0.3 <= float(download[1]) < 0.8  # the 0.3 s before the files were written, and the copy
    assert float(load[1]) >= 0.4  # the 0.5 s after (each figure is rounded to 0.1 s)


def test_a_failed_load_says_where(load_log, hub_cache):
    with pytest.raises(OSError):
        create_text_engine(ModelConfig(name="absent", hf_id="mmserve-test/absent"))
    records = load_log()
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]  # the failure's own line is the slot's
    assert records[0].getMessage().startswith("loading decoder 'absent': source hub mmserve-test/absent (not in")
    assert re.fullmatch(
        rf"loading decoder 'absent': tokenizer from_pretrained failed after {SECONDS} \(OSError\)",
        records[1].getMessage(),
    )
