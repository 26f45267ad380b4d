"""The hostile-input suite (test_hostile_input.py) against a native-vision primary: the same cases,
key and limits, with the tiny LLaVA itself as the primary (images go to it, not to a captioner).
The test functions are that module's; pytest gives them this module's `service`."""

from __future__ import annotations

import pytest

from tests.serve.conftest import deploy, undeploy, write_models
from tests.serve.test_hostile_input import (  # noqa: F401 - collected here, against this module's service
    LIMITS,
    MODEL,
    http,
    test_health_is_open_without_a_key,
    test_hostile_request_gets_a_clear_error_and_the_service_stays_up,
    test_logs_hold_no_key_and_no_image_bytes,
    test_valid_image_request_with_the_key_succeeds,
)


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory, tiny_vlm_dir):
    models = write_models(
        tmp_path_factory.mktemp("hostile-native"),
        [
            {
                "name": MODEL,
                "local_path": str(tiny_vlm_dir),
                "params": {"max_tokens": 4, "max_num_seqs": 4, "temperature": 0, "batch_wait_ms": 0},
                "capabilities": {"vision_mode": "native"},
            }
        ],
        **LIMITS,
    )
    deploy(models, decoder_cpu_replicas=1)
    yield
    undeploy("default", "vision")
