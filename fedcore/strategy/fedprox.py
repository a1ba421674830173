"""FedProx (Li et al., 2020, "Federated Optimization in Heterogeneous Networks").

FedProx changes the nodes' objective, not the server's: each node adds
``μ/2 · ‖w − w_global‖²`` to its training loss, which keeps a node with much more
local work, or very different data, from drifting far from the global model. The
server aggregates exactly as FedAvg does; all the strategy does is tell the nodes
``μ``, as ``"proximal-mu"`` in every training config (Flower 1.42's key), so a
ClientApp reads ``msg.content["config"]["proximal-mu"]``. A ClientApp that ignores
it trains plain FedAvg.
"""

from __future__ import annotations

import logging

from fedcore.domain import ArrayRecord, ConfigRecord, Message
from fedcore.strategy import arguments
from fedcore.strategy.fedavg import FedAvg, MetricsAggregation
from fedcore.strategy.sampling import Nodes

log = logging.getLogger("fedcore.strategy")

PROXIMAL_MU_KEY = "proximal-mu"
"""The training-config key that carries ``proximal_mu``."""


class FedProx(FedAvg):
    """FedAvg that sends the proximal-term weight ``proximal_mu`` (>= 0) to the nodes."""

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
        proximal_mu: float = 0.0,
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
        self.proximal_mu = arguments.non_negative("proximal_mu", proximal_mu)
        if self.proximal_mu == 0.0:
            # The default; likely forgotten rather than meant, so say what it amounts to.
            log.warning("FedProx with proximal_mu=0 trains exactly as FedAvg")

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        config = ConfigRecord(config)
        config[PROXIMAL_MU_KEY] = self.proximal_mu
        return super().configure_train(server_round, arrays, config, node_ids)
