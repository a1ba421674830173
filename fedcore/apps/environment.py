"""The environment an app process starts with: what it needs to run, and no secrets.

A ServerApp or ClientApp process runs code that whoever submitted the run wrote.
It must not inherit what the link, node or exec that starts it holds in its own
environment: ``FEDCORE_CONTROL_TOKEN`` (which lets a ``fedcore`` command submit and
stop runs), cloud credentials, an operator's tokens. So a deployment's app
process gets :func:`app_environment`: only the variables a Python program — numpy,
torch, a CUDA device — needs to find its interpreter, libraries, locale, devices
and scratch space (:data:`ALLOWED` and :data:`ALLOWED_PREFIXES`), plus those the
operator passes on purpose (``fedcore serve --app-env NAME``), plus what fedcore
itself sets for the process. Nothing named ``FEDCORE_*`` is ever taken from the
parent: what an app process needs of fedcore's is set for it, one variable each.

A simulation is different: its ClientApps are the user's own code, started from
the user's own shell, and may rely on any variable set there. Its workers get the
whole inherited environment but for fedcore's secrets (:func:`without_secrets`):
every ``FEDCORE_*`` variable whose name says token, secret, key or password.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from fedcore.errors import UsageError

FEDCORE_PREFIX = "FEDCORE_"
"""fedcore's own variables: never passed from a parent to an app process."""

ALLOWED = frozenset(
    {
        # The interpreter and its packages
        "PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONHASHSEED",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "LD_LIBRARY_PATH",
        # Who and where
        "HOME",
        "USER",
        "LOGNAME",
        "TMPDIR",
        "TZ",
        # Locale
        "LANG",
        "LANGUAGE",
        # Devices and thread pools (numpy's BLAS, OpenMP, torch)
        "CUDA_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        # Certificates for downloads (a data set fetched over HTTPS)
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
    }
)
"""Variables an app process takes from its parent's environment."""

ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "PYTORCH_")
"""Families of variables it takes too: locale categories, CUDA's and NVIDIA's device
settings, PyTorch's allocator and backend settings."""

SECRET_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD")
"""A ``FEDCORE_*`` variable whose name holds one of these is a secret."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def app_environment(inherited: Mapping[str, str], passed: Iterable[str] = ()) -> dict[str, str]:
    """The variables of ``inherited`` a deployment's app process gets.

    Those of :data:`ALLOWED` and :data:`ALLOWED_PREFIXES`, and those named in
    ``passed`` (the operator's ``--app-env``); never a ``FEDCORE_*`` one.
    """
    extra = set(passed)
    return {
        name: value
        for name, value in inherited.items()
        if not name.startswith(FEDCORE_PREFIX)
        and (name in ALLOWED or name.startswith(ALLOWED_PREFIXES) or name in extra)
    }


def without_secrets(inherited: Mapping[str, str]) -> dict[str, str]:
    """``inherited`` but for fedcore's secrets (a simulation's workers): ``FEDCORE_*``
    names holding one of :data:`SECRET_WORDS`, ``FEDCORE_CONTROL_TOKEN`` first."""
    return {name: value for name, value in inherited.items() if not _secret(name)}


def _secret(name: str) -> bool:
    return name.startswith(FEDCORE_PREFIX) and any(word in name for word in SECRET_WORDS)


def check_passed(names: Iterable[str]) -> tuple[str, ...]:
    """``--app-env`` names as given; :class:`UsageError` for one that is not a variable's
    name or is one of fedcore's own."""
    checked = tuple(names)
    for name in checked:
        if not _NAME.fullmatch(name):
            raise UsageError(f"--app-env {name!r} is not an environment variable's name")
        if name.startswith(FEDCORE_PREFIX):
            raise UsageError(
                f"--app-env {name}: fedcore's own variables never reach an app process"
            )
    return checked
