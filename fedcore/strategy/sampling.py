"""Where a configure method's nodes come from: ids already chosen, or a Grid to ask.

fedcore's round driver waits for nodes, shuffles their ids with the run's seed and
passes the list to ``configure_train`` / ``configure_evaluate``: the pure form, which
a test calls with a plain list. Flower passes the Grid itself, so Flower-style code
does too — a strategy whose own ``start`` loop calls
``self.configure_train(round, arrays, config, grid)``, or a subclass that hands the
grid it got on to ``super()``. Given a Grid, :func:`candidates` does what the driver
would have done: waits, bounded, for the strategy's ``min_nodes`` of the phase, then
shuffles the online ids by (seed, round, phase). The two forms therefore choose the
same nodes for the same seed, and neither waits without end.

Waiting blocks, as Flower's does: a :class:`~fedcore.apps.grid.SyncGrid` (what a
plain ``def main`` gets) or an async :class:`~fedcore.apps.grid.Grid` used from a
worker thread. In the event loop itself a blocking wait would freeze every other
task, so there an async Grid is refused with a message saying what to pass instead.

:func:`sample_nodes` is Flower's ``strategy_utils`` helper of the same name, for a
strategy that samples by itself: bounded in the same way, and seeded by the run.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np

from fedcore.apps.grid import Grid, SyncGrid
from fedcore.strategy.protocol import Strategy
from fedcore.strategy.result import Phase
from fedcore.strategy.rounds import DEFAULT_TIMEOUT, sampling_seed, shuffled

Nodes: TypeAlias = Sequence[int] | Grid | SyncGrid
"""What a configure method takes as its fourth argument: candidate node ids in the
order to take them (fedcore's driver), or the Grid to sample through (Flower's form)."""


def candidates(
    strategy: Strategy,
    phase: Phase,
    server_round: int,
    nodes: Nodes,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> Sequence[int]:
    """The candidate node ids of ``phase`` in order: ``nodes`` itself when it is ids;
    from a Grid, the ids online once ``strategy.min_nodes(phase)`` are, shuffled with
    the run's seed (``[]`` when the phase needs no nodes).

    A Grid that has not enough nodes within ``timeout`` seconds (``start``'s default)
    raises :class:`~fedcore.errors.NotEnoughNodesError`, as ``start`` does.
    """
    if isinstance(nodes, Grid):
        nodes = _blocking(nodes, f"{type(strategy).__name__}.configure_{phase}")
    if isinstance(nodes, SyncGrid):
        needed = strategy.min_nodes(phase)
        if needed <= 0:
            return []
        online = nodes.wait_for_nodes(needed, timeout=timeout)
        return shuffled(online, sampling_seed(nodes.run), server_round, phase)
    if isinstance(nodes, str | bytes) or not isinstance(nodes, Sequence):
        raise TypeError(
            f"{type(strategy).__name__}.configure_{phase} takes node ids or a Grid, "
            f"got {type(nodes).__name__}"
        )
    return nodes


_draws: weakref.WeakKeyDictionary[Grid, itertools.count[int]] = weakref.WeakKeyDictionary()
"""How many samples each run's Grid has drawn: the next one's stream of the run's seed."""


def sample_nodes(
    grid: Grid | SyncGrid,
    min_available_nodes: int,
    sample_size: int,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> tuple[list[int], list[int]]:
    """``sample_size`` nodes drawn from those online, and all those online, once at
    least ``max(min_available_nodes, sample_size)`` are (Flower's ``strategy_utils``
    name and arguments).

    Waits at most ``timeout`` seconds, then raises
    :class:`~fedcore.errors.NotEnoughNodesError`, where Flower's waits for ever. Each
    call draws anew, as Flower's ``random.sample`` does, but from the run's seed (its
    ``n``-th call from the ``n``-th stream), so a seeded run samples the same nodes
    every time; an unseeded one at random.
    """
    if sample_size < 0:
        raise ValueError(f"sample_size must be >= 0, got {sample_size}")
    if isinstance(grid, Grid):
        grid = _blocking(grid, "sample_nodes")
    online = grid.wait_for_nodes(max(min_available_nodes, sample_size), timeout=timeout)
    seed = sampling_seed(grid.run)
    draw = next(_draws.setdefault(grid.async_grid, itertools.count()))
    ordered = sorted(online)
    rng = np.random.default_rng(None if seed is None else [seed, draw])
    picked = rng.choice(len(ordered), size=sample_size, replace=False)
    return [ordered[int(index)] for index in picked], online


def _blocking(grid: Grid, caller: str) -> SyncGrid:
    """``grid`` as a blocking Grid, outside the event loop; a ``TypeError`` saying what
    to do instead inside it."""
    if _in_event_loop():
        raise TypeError(
            f"{caller} was given an async Grid in the event loop, where waiting for nodes "
            "would block every task; pass it the node ids (await grid.wait_for_nodes(...)) "
            "or call it from a plain `def main`, whose grid waits in a worker thread"
        )
    return SyncGrid(grid)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
