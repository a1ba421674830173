"""Running a suite on every simulation backend, Ray's included, with one Ray for all of it.

:func:`backend_params` is :data:`~fedcore.simulation.backends.BACKENDS` as pytest
parameters, ``ray`` carrying the ``ray`` marker. The plugin
(:mod:`fedcore.testing.plugin`) skips tests so marked where Ray is not installed, and
opens, for the first of them (they run last), one Ray of fedcore's own for the rest of the
session: each simulation on the ``ray`` backend then starts its actors on that Ray
instead of starting (for seconds) and stopping a Ray of its own — as several
simulations of one process share the Ray the first one opened. The tests still see
what a run on a Ray of its own sees: actors sized by the same rule, the app imported
from where it lies rather than shipped.

The shared Ray has :data:`SHARED_CPUS` CPUs and :data:`SHARED_GPUS` GPU, a logical
one: Ray reserves GPUs by count and sets each actor's ``CUDA_VISIBLE_DEVICES``, which
is what fedcore relies on, so fractional GPU sharing is testable on a machine with none.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from fedcore.simulation.backends import BACKENDS
from fedcore.simulation.resources import Resources

SHARED_CPUS = 2
SHARED_GPUS = 1
RAY_MARKER = "ray"


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def backend_params() -> list[Any]:
    """Every backend's name as a pytest parameter; ``ray`` marked ``ray``."""
    return [
        pytest.param(name, marks=pytest.mark.ray) if name == "ray" else name for name in BACKENDS
    ]


def shared_ray() -> Iterator[None]:
    """Open the session's Ray; close it (and stop it) at the end."""
    from fedcore.simulation.backends.ray_cluster import close_session, open_session

    system = Resources(num_cpus=SHARED_CPUS, num_gpus=SHARED_GPUS)
    session = anyio.run(open_session, None, system)
    try:
        yield
    finally:
        anyio.run(close_session, session)
