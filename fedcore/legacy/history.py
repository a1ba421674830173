"""``History``: what a legacy run measured, round by round, as Flower's server records it.

``Server.fit`` and ``DefaultWorkflow`` fill it: the losses and metrics of distributed
evaluation (aggregated from the clients' ``evaluate``), of centralized evaluation
(the strategy's ``evaluate``, round 0 included) and the aggregated ``fit`` metrics.
Its ``repr`` is the summary both log at the end of a run, in Flower's layout, since
scripts and tests read it.
"""

from __future__ import annotations

import pprint

from fedcore.legacy.types import Scalar


class History:
    """Losses as ``[(round, loss)]`` and metrics as ``{name: [(round, value)]}``."""

    def __init__(self) -> None:
        self.losses_distributed: list[tuple[int, float]] = []
        self.losses_centralized: list[tuple[int, float]] = []
        self.metrics_distributed_fit: dict[str, list[tuple[int, Scalar]]] = {}
        self.metrics_distributed: dict[str, list[tuple[int, Scalar]]] = {}
        self.metrics_centralized: dict[str, list[tuple[int, Scalar]]] = {}

    def add_loss_distributed(self, server_round: int, loss: float) -> None:
        self.losses_distributed.append((server_round, loss))

    def add_loss_centralized(self, server_round: int, loss: float) -> None:
        self.losses_centralized.append((server_round, loss))

    def add_metrics_distributed_fit(self, server_round: int, metrics: dict[str, Scalar]) -> None:
        _append(self.metrics_distributed_fit, server_round, metrics)

    def add_metrics_distributed(self, server_round: int, metrics: dict[str, Scalar]) -> None:
        _append(self.metrics_distributed, server_round, metrics)

    def add_metrics_centralized(self, server_round: int, metrics: dict[str, Scalar]) -> None:
        _append(self.metrics_centralized, server_round, metrics)

    def __repr__(self) -> str:
        """One section per kind that has entries: losses a line per round, metrics as
        their dict pretty-printed (Flower's layout, which logs and scripts read)."""
        sections = []
        for title, losses in (
            ("distributed", self.losses_distributed),
            ("centralized", self.losses_centralized),
        ):
            if losses:
                rounds = "".join(
                    f"\tround {server_round}: {loss}\n" for server_round, loss in losses
                )
                sections.append(f"History (loss, {title}):\n{rounds}")
        for title, metrics in (
            ("distributed, fit", self.metrics_distributed_fit),
            ("distributed, evaluate", self.metrics_distributed),
        ):
            if metrics:
                sections.append(f"History (metrics, {title}):\n{pprint.pformat(metrics)}\n")
        if self.metrics_centralized:
            sections.append(
                f"History (metrics, centralized):\n{pprint.pformat(self.metrics_centralized)}"
            )
        return "".join(sections)


def _append(
    history: dict[str, list[tuple[int, Scalar]]], server_round: int, metrics: dict[str, Scalar]
) -> None:
    for key, value in metrics.items():
        history.setdefault(key, []).append((server_round, value))
