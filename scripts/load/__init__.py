"""The load test's pieces (`scripts/loadtest.py`): whose answer an answer is (`answer_check`), the
faults it injects (`faults`), what it watches on the service while it runs (`watch`) and its report
(`report`). Scripts never import the tests; the tests may import from `scripts/` (a test checks).
"""
