"""The environment app processes start with: an allow-list in deployment, no secrets anywhere."""

from __future__ import annotations

import pytest

from fedcore.apps.environment import app_environment, check_passed, without_secrets
from fedcore.errors import UsageError

PARENT = {
    "PATH": "/usr/bin",
    "HOME": "/home/op",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "CUDA_VISIBLE_DEVICES": "0",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "OMP_NUM_THREADS": "2",
    "VIRTUAL_ENV": "/venv",
    "FEDCORE_CONTROL_TOKEN": "t" * 43,
    "FEDCORE_LINK": "127.0.0.1:9093",
    "AWS_SECRET_ACCESS_KEY": "s" * 40,
    "HF_TOKEN": "h" * 30,
    "WANDB_PROJECT": "mine",
}


def test_a_deployment_app_gets_what_it_needs_and_only_what_is_passed_beside() -> None:
    assert app_environment(PARENT) == {
        name: PARENT[name]
        for name in (
            "PATH", "HOME", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
            "OMP_NUM_THREADS", "VIRTUAL_ENV",
        )
    }  # fmt: skip
    passed = app_environment(PARENT, ["WANDB_PROJECT", "NOT_SET_ANYWHERE"])
    assert passed["WANDB_PROJECT"] == "mine"
    assert "NOT_SET_ANYWHERE" not in passed
    assert "HF_TOKEN" not in passed


def test_fedcore_s_own_variables_are_never_passed_on() -> None:
    assert not any(name.startswith("FEDCORE_") for name in app_environment(PARENT))
    with pytest.raises(UsageError, match="fedcore's own variables"):
        check_passed(["FEDCORE_CONTROL_TOKEN"])
    with pytest.raises(UsageError, match="not an environment variable's name"):
        check_passed(["A=B"])
    assert check_passed(["WANDB_PROJECT"]) == ("WANDB_PROJECT",)


def test_a_simulation_worker_keeps_the_user_s_environment_but_fedcore_s_secrets() -> None:
    kept = without_secrets({**PARENT, "FEDCORE_RUN_SECRET": "x", "FEDCORE_AUTH_KEY": "k"})
    assert kept == {
        name: value for name, value in PARENT.items() if name != "FEDCORE_CONTROL_TOKEN"
    }
