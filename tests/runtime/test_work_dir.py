"""The work directory lock, in one process: held inside, refused to a second holder
with the directory, the holder's pid and ``--work-dir``, free again on leaving."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedcore.errors import UsageError
from fedcore.runtime.work_dir import LOCK_FILE, hold_work_dir


def test_a_held_work_dir_is_refused_to_a_second_holder_until_released(tmp_path: Path) -> None:
    work_dir = tmp_path / "made" / "node"
    with hold_work_dir(work_dir):
        assert (work_dir / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(UsageError) as refused, hold_work_dir(work_dir):
            pytest.fail("a held work directory was held twice")
        message = str(refused.value)
        assert str(work_dir.resolve()) in message
        assert f"pid {os.getpid()}" in message
        assert "--work-dir" in message
    with hold_work_dir(work_dir):
        pass


def test_a_work_dir_that_cannot_be_made_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with (
        pytest.raises(UsageError, match="cannot use the work directory"),
        hold_work_dir(blocker / "node"),
    ):
        pytest.fail("a work directory under a file was held")
