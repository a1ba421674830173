"""Decoding received bytes without holding the event loop that received them.

A process's event loop serves everyone at once: a link's loop answers a thousand
nodes' heartbeats and its ServerApps' calls. Decoding what a peer sent costs time in
proportion to what it sent (and, for a msgpack header, to the objects it decodes to,
bounded by :attr:`~fedcore.wire.frame.DecodeLimits.max_objects`), so anything over
:data:`OFF_LOOP_BYTES` is decoded in a worker thread. msgpack's decoder calls back
into Python for every list (the object count), so the loop gets the GIL back every
few milliseconds even while a hostile header is counted out.

At most :data:`DECODERS` such decodes run at once in a process (more wait their
turn), so that peers pushing many hostile payloads together cost at most that many
budgets of memory, not one each.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

from fedcore.wire.frame import Buffer

OFF_LOOP_BYTES = 16 * 1024
"""Bytes past which received data is decoded in a worker thread, not on the event loop:
16 KiB of the worst msgpack (empty lists) decodes in about a millisecond."""
DECODERS = 4
"""Decodes of received data that run in worker threads at once, in one process."""

_T = TypeVar("_T")
_Data = TypeVar("_Data", bound=Buffer)
_limiter: RunVar[anyio.CapacityLimiter] = RunVar("fedcore.transport.off_loop")


async def decoded(decode: Callable[[_Data], _T], data: _Data) -> _T:
    """``decode(data)``: on the loop when ``data`` is small, else in a worker thread."""
    return await decoded_from(partial(decode, data), len(data))


async def decoded_from(decode: Callable[[], _T], size: int) -> _T:
    """``decode()``, which decodes ``size`` received bytes it holds (a node's payload
    sink): on the loop when they are few, else in a worker thread."""
    if size <= OFF_LOOP_BYTES:
        return decode()
    # Handed over in a list emptied here: the finished future outlives this call by a
    # step of the loop, and would hold what was decoded (and the payload it views).
    handed = await anyio.to_thread.run_sync(lambda: [decode()], limiter=_decoders())
    return handed.pop()


def _decoders() -> anyio.CapacityLimiter:
    """This event loop's limiter of worker threads that decode."""
    try:
        return _limiter.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(DECODERS)
        _limiter.set(limiter)
        return limiter
