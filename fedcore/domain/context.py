"""Context: what an app knows about where it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

from fedcore.domain.records import RecordDict

UserConfigValue: TypeAlias = bool | float | int | str
"""A value of a run or node config, as Flower's ``flwr.app.UserConfigValue``."""
UserConfig: TypeAlias = dict[str, UserConfigValue]
"""A run or node config (``context.run_config``, ``context.node_config``), as Flower's
``flwr.app.UserConfig``."""


@dataclass
class Context:
    """The run and node an app is serving, and the node's persistent state.

    ``state`` is kept per (run, node) across rounds: ClientApps are created anew for
    every message, so anything a node must remember between rounds goes here.
    ``node_config`` describes the node (in simulation ``{"partition-id": i,
    "num-partitions": N}``); ``run_config`` is the run's configuration after
    overrides.
    """

    run_id: int
    node_id: int
    node_config: dict[str, Any] = field(default_factory=dict)
    state: RecordDict = field(default_factory=RecordDict)
    run_config: dict[str, Any] = field(default_factory=dict)
