"""Retiring the nodes never seen again: registrations kept only as long as they may be used.

Under trust on first use any key registers, and each registration costs the link a
row of its database and some memory for as long as it is kept. A node that has been
offline for ``--retire-nodes-after`` seconds is deleted (:meth:`LinkState.retire_nodes`)
and forgotten by whatever caches node ids (the gate's keys, the fleet's runs of each
node). A real node that comes back after that is told its id is unknown and registers
again, as a new node: that is all retirement costs it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import NoReturn, Protocol

import fedcore.defaults as defaults
from fedcore.clock import Clock
from fedcore.state.base import LinkState

log = logging.getLogger(__name__)

RETIRE_NODES_AFTER = defaults.RETIRE_NODES_AFTER
"""Seconds a node with a key may stay offline before the link deletes it: a day."""
MAX_SWEEP_PERIOD = 60.0
"""The longest wait between two looks for nodes to retire."""


class Forgets(Protocol):
    """What keeps something per node id and must drop it when the node is retired."""

    def forget(self, node_ids: Iterable[int]) -> None: ...


def sweep_period(offline_for: float) -> float:
    """How often to look: twice per ``offline_for``, at least once a minute."""
    return min(offline_for, 2 * MAX_SWEEP_PERIOD) / 2


async def retire_nodes(
    state: LinkState, clock: Clock, offline_for: float, forgetting: Sequence[Forgets]
) -> NoReturn:
    """Every :func:`sweep_period`, delete the nodes offline ``offline_for`` seconds or more
    and have ``forgetting`` drop them; one log line per sweep that retired any."""
    period = sweep_period(offline_for)
    while True:
        await clock.sleep(period)
        retired = await state.retire_nodes(offline_for=offline_for)
        if not retired:
            continue
        for keeper in forgetting:
            keeper.forget(retired)
        log.info(
            "retired %d nodes offline for %g s or more (--retire-nodes-after); one that "
            "comes back registers again",
            len(retired),
            offline_for,
        )
