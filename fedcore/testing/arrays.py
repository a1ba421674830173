"""Where an array's memory comes from, for tests that promise a model is not copied.

A model that crosses the link should arrive as a view of a mapping (a spool file,
a shared-memory segment), not as bytes in the process's own memory.
:func:`backing` follows an array's bases to the object that owns its memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def backing(array: np.ndarray[Any, Any]) -> object:
    """The object at the bottom of ``array``'s chain of bases and buffers."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base
