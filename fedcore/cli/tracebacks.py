"""Showing an app author the part of a traceback that is theirs.

When a ServerApp raises, the full traceback is mostly click, anyio, asyncio and
fedcore frames, with the author's own lines at the end. :func:`app_traceback`
hides the frames that belong to fedcore, the standard library and installed
packages, and says so; when nothing would be left, it shows everything.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path

import fedcore

_HIDDEN = tuple(
    {
        str(Path(fedcore.__file__).resolve().parent),
        *(
            str(Path(sysconfig.get_path(name)).resolve())
            for name in ("stdlib", "purelib", "platlib")
        ),
    }
)


def _is_theirs(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    return not str(Path(filename).resolve()).startswith(_HIDDEN)


def app_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` with only the app's own frames, or whole if it has none."""
    frames = traceback.extract_tb(exc.__traceback__)
    theirs = traceback.StackSummary.from_list([f for f in frames if _is_theirs(f.filename)])
    if not theirs or isinstance(exc, BaseExceptionGroup):
        return "".join(traceback.format_exception(exc))
    hidden = len(frames) - len(theirs)
    header = (
        f"Traceback (most recent call last; {hidden} frames of fedcore and libraries hidden):\n"
    )
    return header + "".join(theirs.format()) + "".join(traceback.format_exception_only(exc))
