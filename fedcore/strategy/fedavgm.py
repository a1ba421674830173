"""FedAvgM (Hsu et al., 2019, "Measuring the Effects of Non-Identical Data Distribution").

FedAvg moves the global model all the way to the round's mean. FedAvgM treats
``current − mean`` as a gradient and takes a server SGD step with heavy-ball
momentum on it (:func:`~fedcore.strategy.optimizers.momentum_step`), which damps
the round-to-round swings that skewed cohorts cause. With
``server_learning_rate=1`` and ``server_momentum=0`` (the defaults, as in Flower
1.42) it is FedAvg exactly: the mean is returned as is.

The momentum is kept per array key for the life of the strategy instance (one
``start`` per instance); integer and boolean arrays take the plain mean and have
no momentum (see :mod:`fedcore.strategy.optimizers`); with ``server_momentum=0``
nothing is kept. An aggregate or model whose layout differs from the momentum's is
refused with :class:`~fedcore.errors.AggregationError` (a ``ValueError``).
"""

from __future__ import annotations

import numpy as np

from fedcore.domain import ArrayRecord, RecordDict
from fedcore.domain.array import NDArray
from fedcore.strategy import arguments
from fedcore.strategy.fedavg import FedAvg, MetricsAggregation
from fedcore.strategy.optimizers import load_states, momentum_step, states_record, step_floats


class FedAvgM(FedAvg):
    """FedAvg with server-side momentum (``server_momentum`` in [0, 1))."""

    server_opt: bool
    """Whether the server steps at all; if not, the mean is the new model, as in FedAvg."""
    momentum_vector: dict[str, NDArray]
    """The velocity of every float array, by key (empty before the first update)."""

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
        server_learning_rate: float = 1.0,
        server_momentum: float = 0.0,
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
        self.server_learning_rate = arguments.positive("server_learning_rate", server_learning_rate)
        self.server_momentum = arguments.in_range("server_momentum", server_momentum, 0.0, 1.0)
        self.server_opt = self.server_learning_rate != 1.0 or self.server_momentum != 0.0
        self.momentum_vector = {}

    def state(self) -> RecordDict:
        """The server's velocity (``momentum_vector``): what the next step starts from."""
        return states_record({"momentum_vector": self.momentum_vector})

    def load_state(self, state: RecordDict) -> None:
        load_states("FedAvgM", state, {"momentum_vector": self.momentum_vector})

    def server_update(self, server_round: int, aggregated: ArrayRecord) -> ArrayRecord:
        if not self.server_opt:
            return aggregated
        if self.current_arrays is None:
            raise RuntimeError("FedAvgM has no model to step from: call configure_train first")
        return ArrayRecord(
            step_floats(
                self.current_arrays,
                aggregated,
                {"momentum_vector": self.momentum_vector},
                self._step,
            )
        )

    def _step(self, key: str, current: NDArray, mean: NDArray) -> NDArray:
        previous = self.momentum_vector.get(key)
        new, velocity = momentum_step(
            current,
            mean,
            np.zeros(current.shape, current.dtype) if previous is None else previous,
            learning_rate=self.server_learning_rate,
            momentum=self.server_momentum,
        )
        if self.server_momentum > 0.0:
            self.momentum_vector[key] = velocity
        return new
