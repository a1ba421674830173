"""Pool sizing: how many workers fit the machine, and which GPUs each one sees."""

from __future__ import annotations

import math
import os
import shutil
import stat
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.errors import UsageError
from fedcore.simulation.resources import Resources
from fedcore.workers import sizing
from fedcore.workers.sizing import PoolPlan, detect_cpus, detect_gpus, plan_pool


def machine(cpus: float, gpus: float = 0) -> Resources:
    return Resources(num_cpus=cpus, num_gpus=gpus)


def ask(cpus: float = 1, gpus: float = 0) -> Resources:
    return Resources(num_cpus=cpus, num_gpus=gpus)


@pytest.fixture
def no_gpu_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where neither CUDA_VISIBLE_DEVICES nor nvidia-smi says anything."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)


def fake_nvidia_smi(directory: Path, script: str) -> None:
    """Put an ``nvidia-smi`` running ``script`` (a /bin/sh body) alone on a directory."""
    directory.mkdir()
    tool = directory / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


# ---------------------------------------------------------------- CPU sizing


@pytest.mark.parametrize(
    ("cpus", "num_cpus", "workers", "threads"),
    [
        (8, 1, 8, 1),
        (8, 3, 2, 3),
        (7, 2, 3, 2),
        (2, 0.5, 4, 1),
        (1, 1, 1, 1),
        (16, 16, 1, 16),
        (4.5, 1.5, 3, 2),
        (7, 0.07, 100, 1),
    ],
)
def test_cpu_only_pool_is_floor_of_cpus_over_request_each_with_its_threads_rounded_up(
    cpus: float, num_cpus: float, workers: int, threads: int
) -> None:
    plan = plan_pool(ask(num_cpus), machine(cpus, 4))
    assert plan == PoolPlan(workers, (), threads)


def test_cpu_only_plan_sets_no_environment_even_on_a_gpu_machine() -> None:
    plan = plan_pool(ask(2), machine(8, 4))
    assert plan.devices == ()
    assert [plan.environment(i) for i in range(plan.workers)] == [{}] * 4


def test_more_cpus_than_the_machine_has_is_refused_naming_both() -> None:
    with pytest.raises(UsageError, match=r"asks for 4 CPUs.* has 2\b"):
        plan_pool(ask(4), machine(2))
    with pytest.raises(UsageError, match=r"asks for 1\.5 CPUs.* has 1\b"):
        plan_pool(ask(1.5), machine(1))


# ---------------------------------------------------------------- GPU sizing


@pytest.mark.parametrize(
    ("num_gpus", "gpus", "devices"),
    [
        (0.5, 2, [("0",), ("1",), ("0",), ("1",)]),
        (0.3, 2, [("0",), ("1",), ("0",), ("1",), ("0",), ("1",)]),
        (0.25, 1, [("0",)] * 4),
        (0.7, 3, [("0",), ("1",), ("2",)]),
        (1, 3, [("0",), ("1",), ("2",)]),
        (0.5, 2.9, [("0",), ("1",), ("0",), ("1",)]),  # a fraction of a device is no device
    ],
)
def test_fractional_and_single_gpu_requests_pack_onto_devices(
    num_gpus: float, gpus: float, devices: list[tuple[str, ...]]
) -> None:
    plan = plan_pool(ask(1, num_gpus), machine(64, gpus))
    assert plan == PoolPlan(len(devices), tuple(devices))
    per_device = Counter(device for (device,) in plan.devices)
    assert max(per_device.values()) <= math.floor(1 / Fraction(str(num_gpus)))


@pytest.mark.parametrize(
    ("num_gpus", "gpus", "devices"),
    [
        (2, 4, [("0", "1"), ("2", "3")]),
        (2, 5, [("0", "1"), ("2", "3")]),  # the odd device left idle, not split
        (1.5, 5, [("0", "1"), ("2", "3")]),  # 1.5 GPUs take two whole devices
        (3, 3, [("0", "1", "2")]),
        (2.01, 8, [("0", "1", "2"), ("3", "4", "5")]),
    ],
)
def test_multi_gpu_requests_get_whole_devices_of_their_own(
    num_gpus: float, gpus: int, devices: list[tuple[str, ...]]
) -> None:
    plan = plan_pool(ask(1, num_gpus), machine(64, gpus))
    assert plan == PoolPlan(len(devices), tuple(devices))
    every_device = [device for worker in plan.devices for device in worker]
    assert len(every_device) == len(set(every_device))


def test_environment_names_each_workers_devices() -> None:
    plan = plan_pool(ask(1, 2), machine(8, 4))
    assert plan.environment(0) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert plan.environment(1) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    shared = plan_pool(ask(1, 0.5), machine(8, 2))
    assert [shared.environment(i)["CUDA_VISIBLE_DEVICES"] for i in range(4)] == [
        "0",
        "1",
        "0",
        "1",
    ]


def test_the_scarcer_of_cpus_and_gpus_sizes_the_pool() -> None:
    assert plan_pool(ask(1, 0.25), machine(3, 2)).workers == 3  # CPUs: 3, GPUs: 8
    assert plan_pool(ask(1, 0.25), machine(30, 2)).workers == 8  # CPUs: 30, GPUs: 8
    assert plan_pool(ask(2, 1), machine(30, 2)).workers == 2


@pytest.mark.parametrize(
    ("num_gpus", "gpus", "pattern"),
    [
        (0.5, 0, r"asks for 0\.5 GPUs.* has no GPU"),
        (1, 0, r"asks for 1 GPUs.* has no GPU"),
        (3, 2, r"asks for 3 GPUs.* has 2 GPUs"),
        (2.5, 2, r"asks for 2\.5 GPUs.* has 2 GPUs"),
        (0.5, 0.9, r"asks for 0\.5 GPUs.* has no GPU"),
    ],
)
def test_gpu_requests_the_machine_cannot_meet_are_refused(
    num_gpus: float, gpus: float, pattern: str
) -> None:
    with pytest.raises(UsageError, match=pattern):
        plan_pool(ask(1, num_gpus), machine(8, gpus))


# ---------------------------------------------------------------- max_workers


def test_max_workers_caps_the_pool() -> None:
    assert plan_pool(ask(1), machine(8), max_workers=3) == PoolPlan(3, ())
    # A capped pool of fractional workers spreads over the devices, round robin.
    assert plan_pool(ask(1, 0.5), machine(8, 2), max_workers=3) == PoolPlan(
        3, (("0",), ("1",), ("0",))
    )
    assert plan_pool(ask(2, 0.25), machine(8, 4)) == PoolPlan(
        4, (("0",), ("1",), ("2",), ("3",)), threads=2
    )
    assert plan_pool(ask(1, 2), machine(8, 8), max_workers=1) == PoolPlan(1, (("0", "1"),))


def test_max_workers_above_what_fits_changes_nothing() -> None:
    assert plan_pool(ask(2), machine(8), max_workers=100) == plan_pool(ask(2), machine(8))
    assert plan_pool(ask(2), machine(8), max_workers=4).workers == 4


@pytest.mark.parametrize("max_workers", [0, -1, -100, False, True])
def test_max_workers_below_one_or_a_bool_is_refused(max_workers: int) -> None:
    with pytest.raises(UsageError, match="max_workers"):
        plan_pool(ask(1), machine(8), max_workers=max_workers)


def test_max_workers_is_checked_before_the_machine() -> None:
    # Even a request the machine could not meet reports the bad flag first.
    with pytest.raises(UsageError, match="max_workers must be at least 1, got 0"):
        plan_pool(ask(100), machine(1), max_workers=0)


# ---------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("visible", "count"),
    [("0,1,3", 3), ("", 0), ("5", 1), (" 2 , 4 ", 2), ("0,,1,", 1), ("-1", 0), ("1,-1,2", 1)],
)
def test_detect_gpus_honours_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str, count: int
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    # CUDA_VISIBLE_DEVICES wins: nvidia-smi is not even looked for.
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: pytest.fail("looked up a tool"))
    assert detect_gpus() == count


@pytest.mark.usefixtures("no_gpu_tools")
def test_detect_gpus_without_nvidia_smi_is_zero() -> None:
    assert detect_gpus() == 0


def test_detect_gpus_counts_the_gpus_nvidia_smi_lists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    listing = "GPU 0: A100 (UUID: GPU-a)\\n  MIG 1g.5gb Device 0\\nGPU 1: A100 (UUID: GPU-b)\\n"
    fake_nvidia_smi(tmp_path / "bin", f'printf "{listing}"\n')
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert detect_gpus() == 2
    plan = plan_pool(ask(0.001, 1), None)
    assert plan.devices == (("0",), ("1",))


def test_detect_gpus_is_zero_when_nvidia_smi_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_nvidia_smi(tmp_path / "bin", 'echo "GPU 0: A100"\nexit 9\n')
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert detect_gpus() == 0


def test_detect_cpus_is_at_least_one(monkeypatch: pytest.MonkeyPatch) -> None:
    found = detect_cpus()
    assert type(found) is int
    assert found >= 1
    if hasattr(os, "sched_getaffinity"):
        assert found == len(os.sched_getaffinity(0))
    # Where there is no affinity mask and the CPU count is unknown: still one.
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert detect_cpus() == 1


def test_detected_machine_maps_workers_onto_visible_device_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7")
    monkeypatch.setattr(sizing, "detect_cpus", lambda: 8)
    plan = plan_pool(ask(1, 0.5), None)
    assert plan == PoolPlan(4, (("4",), ("7",), ("4",), ("7",)))
    assert plan.environment(1) == {"CUDA_VISIBLE_DEVICES": "7"}
    assert plan_pool(ask(1, 2), None) == PoolPlan(1, (("4", "7"),))
    with pytest.raises(UsageError, match="has 2 GPUs"):
        plan_pool(ask(1, 3), None)


def test_detected_machine_sizes_by_its_own_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "detect_cpus", lambda: 6)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert plan_pool(ask(2), None) == PoolPlan(3, (), threads=2)
    with pytest.raises(UsageError, match=r"asks for 8 CPUs.* has 6\b"):
        plan_pool(ask(8), None)
    with pytest.raises(UsageError, match="no GPU"):
        plan_pool(ask(1, 0.5), None)


@pytest.mark.usefixtures("no_gpu_tools")
def test_detected_machine_without_gpus_refuses_gpu_requests() -> None:
    with pytest.raises(UsageError, match="no GPU"):
        plan_pool(ask(0.001, 0.1), None)
    assert plan_pool(ask(0.001), None).devices == ()


# ---------------------------------------------------------------- invariants

gpu_requests = st.just(0.0) | st.floats(0.01, 0.99) | st.floats(1.0, 6.0)


@settings(max_examples=300, deadline=None)
@given(
    cpus=st.integers(1, 64) | st.floats(0.5, 64),
    gpus=st.integers(0, 8) | st.floats(0, 8),
    num_cpus=st.sampled_from([0.1, 0.25, 0.5, 1, 2, 3]) | st.floats(0.05, 80),
    num_gpus=gpu_requests,
    max_workers=st.none() | st.integers(1, 40),
)
def test_plans_never_overcommit_a_device_or_the_cpus(
    cpus: float, gpus: float, num_cpus: float, num_gpus: float, max_workers: int | None
) -> None:
    devices = [str(i) for i in range(math.floor(gpus))]
    by_cpu = math.floor(Fraction(str(cpus)) / Fraction(str(num_cpus)))  # decimal, as documented
    if num_gpus == 0:
        by_gpu = math.inf
    elif num_gpus < 1:
        by_gpu = math.floor(1 / Fraction(str(num_gpus))) * len(devices)
    else:
        by_gpu = len(devices) // math.ceil(num_gpus)
    try:
        plan = plan_pool(ask(num_cpus, num_gpus), machine(cpus, gpus), max_workers)
    except UsageError:
        assert by_cpu < 1 or by_gpu < 1
        return
    assert 1 <= plan.workers <= by_cpu
    # As many as fit: nothing but the CPUs, the GPUs and max_workers stops a worker.
    assert plan.workers == min(by_cpu, by_gpu, max_workers or math.inf)
    if num_gpus == 0:
        assert plan.devices == ()
        return
    assert len(plan.devices) == plan.workers
    for worker, seen in enumerate(plan.devices):
        assert seen
        assert set(seen) <= set(devices)
        assert len(set(seen)) == len(seen)
        assert plan.environment(worker) == {"CUDA_VISIBLE_DEVICES": ",".join(seen)}
    load = Counter(device for seen in plan.devices for device in seen)
    if num_gpus < 1:
        assert all(len(seen) == 1 for seen in plan.devices)
        assert max(load.values()) <= math.floor(1 / Fraction(str(num_gpus)))
    else:
        assert all(len(seen) == math.ceil(num_gpus) for seen in plan.devices)
        assert max(load.values()) == 1


def test_system_gpus_are_taken_from_the_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7")
    plan = plan_pool(ask(1, 1), machine(8, 2))
    assert plan.devices == (("4",), ("7",))
    with pytest.raises(UsageError, match="lists only 2"):
        plan_pool(ask(1, 1), machine(8, 3))


def test_quotients_just_under_a_whole_number_are_not_rounded_down() -> None:
    assert plan_pool(ask(0.07), machine(7)).workers == 100
