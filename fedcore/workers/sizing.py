"""How many workers a process pool runs, and which GPUs each one sees.

The machine offers ``cpus`` and ``gpus`` (detected, or given as a system
:class:`Share`, such as the simulation's ``Resources``); each ClientApp asks for
``num_cpus`` and ``num_gpus``. The pool runs

    N = min(floor(cpus / num_cpus), floor(gpus / num_gpus))     (GPU term only when num_gpus > 0)

workers, capped by ``max_workers``. Fractional GPU requests put at most
``floor(1 / num_gpus)`` workers on one device, dealt round robin so that a pool capped
by CPUs spreads over all devices; larger ones give each worker ``ceil(num_gpus)``
devices of its own (a device is never split between workers that asked for more than
one). An explicit system GPU count takes the first of the devices
``CUDA_VISIBLE_DEVICES`` allows, never others. Each
worker sees only its devices through ``CUDA_VISIBLE_DEVICES``, and runs
``ceil(num_cpus)`` compute threads (:mod:`.threads`). A request no machine
of this size can meet is refused at once with what was asked and what exists,
rather than waiting for resources that will never free up.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from fedcore.errors import UsageError
from fedcore.workers.threads import thread_count


class Share(Protocol):
    """CPUs and GPUs: what one ClientApp asks for, or what a machine offers
    (:class:`fedcore.Resources` is one)."""

    @property
    def num_cpus(self) -> float: ...

    @property
    def num_gpus(self) -> float: ...


def detect_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _listed_devices(visible: str) -> list[str]:
    """The devices ``CUDA_VISIBLE_DEVICES`` lists; as in CUDA, a negative entry ends the list."""
    devices = []
    for entry in (part.strip() for part in visible.split(",")):
        if not entry or entry.startswith("-"):
            break
        devices.append(entry)
    return devices


def detect_gpus() -> int:
    """CUDA devices visible here: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len(_listed_devices(visible))
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return 0
    try:
        listing = subprocess.run(
            [nvidia_smi, "-L"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def _visible_device_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(detect_gpus())]
    return _listed_devices(visible)


@dataclass(frozen=True)
class PoolPlan:
    """The sizing decision: how many workers, the devices of each, and their threads."""

    workers: int
    devices: tuple[tuple[str, ...], ...]
    threads: int = 1
    """The compute threads each worker may run (:mod:`.threads`)."""

    def environment(self, worker: int) -> dict[str, str]:
        """Environment overrides for worker number ``worker``."""
        if not self.devices:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices[worker])}


def plan_pool(
    request: Share, system: Share | None = None, max_workers: int | None = None
) -> PoolPlan:
    """Size a pool for ClientApps that each need ``request`` on a machine offering ``system``."""
    if max_workers is not None and (isinstance(max_workers, bool) or max_workers < 1):
        raise UsageError(f"max_workers must be at least 1, got {max_workers!r}")
    cpus = system.num_cpus if system is not None else float(detect_cpus())
    device_ids = _visible_device_ids() if system is None else _system_devices(system)
    gpus = len(device_ids)
    by_cpu = fit(cpus, request.num_cpus)
    if by_cpu < 1:
        raise UsageError(
            f"each ClientApp asks for {request.num_cpus:g} CPUs but this machine has {cpus:g}"
        )
    workers = by_cpu
    devices: list[tuple[str, ...]] = []
    if request.num_gpus > 0:
        by_gpu = gpu_slots(request.num_gpus, len(device_ids))
        if by_gpu < 1:
            found = f"{gpus:g} GPUs" if gpus else "no GPU"
            raise UsageError(
                f"each ClientApp asks for {request.num_gpus:g} GPUs but this machine has {found}; "
                "ask for num_gpus=0 to run on the CPU"
            )
        workers = min(workers, by_gpu)
    if max_workers is not None:
        workers = min(workers, max_workers)
    if request.num_gpus > 0:
        devices = [_devices_of(worker, request.num_gpus, device_ids) for worker in range(workers)]
    return PoolPlan(workers, tuple(devices), thread_count(request.num_cpus))


def fit(available: float, each: float) -> int:
    """How many shares of ``each`` fit in ``available``: ``floor(available / each)``, in
    decimal: 7 CPUs at 0.07 each make 100 workers, not the 99 that floating-point
    division gives."""
    return math.floor(Fraction(str(available)) / Fraction(str(each)))


def _system_devices(system: Share) -> list[str]:
    """The first ``system.num_gpus`` of the devices this process may use."""
    count = math.floor(system.num_gpus)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(count)]
    listed = _listed_devices(visible)
    if count > len(listed):
        raise UsageError(
            f"system GPUs set to {count}, but CUDA_VISIBLE_DEVICES lists only {len(listed)}"
        )
    return listed[:count]


def gpu_slots(num_gpus: float, devices: int) -> int:
    """Workers that fit on ``devices`` GPUs: ``floor(1 / num_gpus)`` per device, or
    ``ceil(num_gpus)`` devices each."""
    if num_gpus < 1:
        return fit(1, num_gpus) * devices
    return devices // math.ceil(num_gpus)


def _devices_of(worker: int, num_gpus: float, device_ids: list[str]) -> tuple[str, ...]:
    if num_gpus < 1:  # round robin: a capped pool spreads over the devices
        return (device_ids[worker % len(device_ids)],)
    count = math.ceil(num_gpus)
    return tuple(device_ids[worker * count : (worker + 1) * count])
