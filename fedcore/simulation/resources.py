"""Resources: what one ClientApp run needs, which sizes a backend's concurrency."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Resources:
    """CPUs and GPUs one ClientApp run asks for; fractions share a device.

    A process backend runs ``min(floor(cpus / num_cpus), floor(gpus / num_gpus))``
    ClientApps at once (the GPU term only when ``num_gpus > 0``).
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_cpus", "num_gpus"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ValueError(f"Resources({name}=...) must be a finite number, got {value!r}")
        if self.num_cpus <= 0:
            raise ValueError(f"Resources(num_cpus=...) must be positive, got {self.num_cpus}")
        if self.num_gpus < 0:
            raise ValueError(f"Resources(num_gpus=...) must not be negative, got {self.num_gpus}")
