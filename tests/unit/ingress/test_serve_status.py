"""Serve's messages as /health and degraded answers quote them: one line, a replica's traceback cut
to the exception at its end."""

from deployments.ingress.serve_status import brief

# What Serve 2.60 shows for a captioner replica whose start failed (its initial health check raised),
# paths shortened; Ray colours the replica's name.
START_FAILED = """A replica failed to start with exception. Retrying. Error:
\x1b[36mray::ServeReplica:vision:VisionCaptioner.initialize_and_get_metadata()\x1b[39m (pid=1, ip=192.0.2.2)
  File "/usr/lib/python3.11/concurrent/futures/_base.py", line 456, in result
    return self.__get_result()
           ^^^^^^^^^^^^^^^^^^^
  File "ray/serve/_private/replica.py", line 1928, in initialize
    raise RuntimeError(traceback.format_exc()) from None
RuntimeError: Traceback (most recent call last):
  File "ray/serve/_private/replica.py", line 1926, in initialize
    await self.check_health()
  File "deployments/replicas/captioner.py", line 124, in check_health
    raise CaptionerUnavailable(f"captioner {self._slot.name!r} cannot load: {self._slot.error}")
deployments.errors.CaptionerUnavailable: captioner 'cap' cannot load: ValueError: Unrecognized processing class
in /models/cap."""


def test_a_replicas_traceback_is_cut_to_its_exception():
    assert brief(START_FAILED) == (
        "A replica failed to start with exception. Retrying. Error: deployments.errors.CaptionerUnavailable: "
        "captioner 'cap' cannot load: ValueError: Unrecognized processing class in /models/cap."
    )


def test_other_messages_are_kept_on_one_line():
    slow = "Deployment 'VisionCaptioner' has 1 replicas that have taken more than 30s to initialize.\nThis may be..."
    assert brief(slow) == slow.replace("\n", " ")
    assert brief("") == ""
