"""Fixtures of the adversarial tests: the worker tests' ``monitor stream`` processes and
paging service (``tests/worker/conftest.py``), on topics of a test's own."""

from tests.worker.conftest import paging, start_stream  # noqa: F401 - fixtures
