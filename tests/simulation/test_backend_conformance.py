"""The backend conformance suite (:mod:`fedcore.testing.backend`) on every backend."""

from __future__ import annotations

import pytest

from fedcore.testing.backend import BackendConformance, WorkerBackendConformance
from fedcore.testing.backend_apps import CRASH_STATUS

pytestmark = pytest.mark.anyio


class TestInlineBackend(BackendConformance):
    backend = "inline"


class TestProcessBackend(WorkerBackendConformance):
    backend = "process"
    children = True
    exit_words = f"exited with status {CRASH_STATUS}"
    kill_words = "killed by SIGKILL"


@pytest.mark.ray
class TestRayBackend(WorkerBackendConformance):
    backend = "ray"
