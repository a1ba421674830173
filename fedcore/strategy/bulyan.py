"""Bulyan (El Mhamdi et al., 2018): a robust selection, then a robust coordinate-wise mean.

With ``n`` valid replies and ``f = num_malicious_nodes``, Bulyan first selects
``θ = n − 2f`` replies with ``selection_rule``, then, coordinate by coordinate, averages
the ``β = θ − 2f`` selected values closest to their median. The selection bounds how
far the malicious updates can sit from the honest ones as whole vectors; the second
step bounds each coordinate, which Krum alone leaves open in high dimension. Both
steps are unweighted; the training metrics are FedAvg's weighted mean over the
selected replies.

The arguments are Flower 1.42's: FedAvg's plus ``num_malicious_nodes`` and
``selection_rule`` — a function ``(contents, num_malicious_nodes, num_nodes_to_select)
-> contents`` over the replies' RecordDicts (the arrays under ``arrayrecord_key``,
then the reply's metric and config records), which must return ``θ`` of the contents
it was given. The default, :func:`iterative_krum`, is the paper's: Krum applied ``θ``
times, each pick removed before the next (Flower's default scores once and takes the
``θ`` best instead).

The paper's guarantee needs ``n ≥ 4f + 3``; a round with fewer valid replies (nodes
failed or timed out) is not aggregated: a warning names both counts and the model
stays as it was, as in Flower. Bulyan needs every reply at once, so a round holds all
of the cohort's models.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from fedcore.domain import ArrayRecord, Message, MetricRecord, RecordDict
from fedcore.strategy import arguments
from fedcore.strategy.aggregate import iterative_krum_select, mean_around_median
from fedcore.strategy.fedavg import FedAvg, MetricsAggregation
from fedcore.strategy.protocol import Aggregation

SelectionRule = Callable[[list[RecordDict], int, int], list[RecordDict]]

log = logging.getLogger("fedcore.strategy")


def iterative_krum(
    contents: list[RecordDict], num_malicious_nodes: int, num_nodes_to_select: int
) -> list[RecordDict]:
    """Bulyan's selection of the paper: Krum applied ``num_nodes_to_select`` times to
    the contents' arrays, each pick removed from the candidates before the next."""
    records = []
    for content in contents:
        array_records = list(content.array_records.values())
        if len(array_records) != 1:
            raise ValueError(f"expected one ArrayRecord per content, found {len(array_records)}")
        records.append(array_records[0])
    picked = iterative_krum_select(records, num_malicious_nodes, num_nodes_to_select)
    return [contents[index] for index in picked]


class Bulyan(FedAvg):
    """Bulyan: robust selection, then the mean around the coordinate-wise median."""

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        num_malicious_nodes: int = 0,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
        selection_rule: SelectionRule | None = None,
        round_timeout: float | None = None,
        *,
        validate_replies: bool = True,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            round_timeout=round_timeout,
            validate_replies=validate_replies,
        )
        self.num_malicious_nodes = arguments.count("num_malicious_nodes", num_malicious_nodes)
        self.selection_rule = selection_rule or iterative_krum

    def __repr__(self) -> str:
        rule = getattr(self.selection_rule, "__name__", type(self.selection_rule).__name__)
        return (
            f"{super().__repr__().removesuffix(')')}, "
            f"num_malicious_nodes={self.num_malicious_nodes}, selection_rule={rule})"
        )

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        """None: the selection compares every reply with every other, in :meth:`aggregate_train`."""
        return None

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(server_round, replies)
        if not valid:
            return None, None
        count, malicious = len(valid), self.num_malicious_nodes
        if count < 4 * malicious + 3:
            # A short round (nodes failed or timed out) must not end the run: skip it.
            log.warning(
                "round %d train: Bulyan needs at least 4 × num_malicious_nodes + 3 = %d "
                "valid replies (num_malicious_nodes=%d), got %d; model unchanged",
                server_round,
                4 * malicious + 3,
                malicious,
                count,
            )
            return None, self.train_metrics(
                [reply.records for reply in valid], [reply.weight for reply in valid]
            )
        theta = count - 2 * malicious
        contents = [
            RecordDict({**reply.records, self.arrayrecord_key: reply.arrays}) for reply in valid
        ]
        positions = _positions(self.selection_rule(contents, malicious, theta), contents, theta)
        selected = [valid[position] for position in positions]
        arrays = mean_around_median([reply.arrays for reply in selected], theta - 2 * malicious)
        metrics = self.train_metrics(
            [reply.records for reply in selected], [reply.weight for reply in selected]
        )
        return self.server_update(server_round, arrays), metrics


def _positions(selected: list[RecordDict], contents: list[RecordDict], theta: int) -> list[int]:
    """Where each selected content sits in ``contents``; ``ValueError`` unless the
    selection is ``theta`` distinct contents among those given."""
    index = {id(content): position for position, content in enumerate(contents)}
    positions = sorted({index[id(content)] for content in selected if id(content) in index})
    if len(selected) != theta or len(positions) != theta:
        raise ValueError(
            f"selection_rule must return {theta} distinct contents of the {len(contents)} "
            f"it was given, returned {len(selected)} of which {len(positions)} were given"
        )
    return positions
