"""FedOpt: the base of the adaptive server optimizers of Reddi et al., 2021.

"Adaptive Federated Optimization" treats ``Δ = mean − current`` as a pseudo-gradient
and feeds it to an adaptive optimizer on the server: a first moment
``m ← β₁m + (1−β₁)Δ`` shared by all, a second moment ``v`` that each variant updates
its own way (:class:`~fedcore.strategy.fedadam.FedAdam`,
:class:`~fedcore.strategy.fedyogi.FedYogi`,
:class:`~fedcore.strategy.fedadagrad.FedAdagrad`), and the step
``current + η · m / (√v + τ)``. A subclass supplies :meth:`FedOpt.adaptive_step`,
one array at a time.

Arguments and defaults are Flower 1.42's (keyword-only): ``eta`` (server step
size), ``eta_l`` (the clients' step size: recorded for the ServerApp to send, not
used by the server), ``beta_1``, ``beta_2`` (in [0, 1)), ``tau`` (> 0; keeps the
step finite where ``v`` is 0). The moments are kept per array key, as
:attr:`FedOpt.m_t` and :attr:`FedOpt.v_t`, for the life of the strategy instance
(one ``start`` per instance) and start at zero, as in Flower (the paper allows
``v₋₁ ≥ τ²``). Integer and boolean arrays take the plain mean and have no moments
(see :mod:`fedcore.strategy.optimizers`); with ``beta_1 = 0`` the first moment is
the pseudo-gradient itself and is not kept. An aggregate or model whose layout
differs from the moments' is refused with
:class:`~fedcore.errors.AggregationError` (a ``ValueError``), as in Flower.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Unpack

import numpy as np

from fedcore.domain import ArrayRecord, RecordDict
from fedcore.domain.array import NDArray
from fedcore.strategy import arguments
from fedcore.strategy.fedavg import FedAvg, FedAvgOptions
from fedcore.strategy.optimizers import load_states, states_record, step_floats


class FedOpt(FedAvg):
    """Adaptive server optimization on the round's mean; subclasses pick the rule."""

    m_t: dict[str, NDArray]
    """First moment of every float array, by key (empty before the first update)."""
    v_t: dict[str, NDArray]
    """Second moment of every float array, by key (empty before the first update)."""

    def __init__(
        self,
        *,
        eta: float = 1e-1,
        eta_l: float = 1e-1,
        beta_1: float = 0.0,
        beta_2: float = 0.0,
        tau: float = 1e-3,
        **options: Unpack[FedAvgOptions],
    ) -> None:
        super().__init__(
            **options,
        )
        self.eta = arguments.positive("eta", eta)
        self.eta_l = arguments.positive("eta_l", eta_l)
        self.beta_1 = arguments.in_range("beta_1", beta_1, 0.0, 1.0)
        self.beta_2 = arguments.in_range("beta_2", beta_2, 0.0, 1.0)
        self.tau = arguments.positive("tau", tau)
        self.m_t = {}
        self.v_t = {}

    @abstractmethod
    def adaptive_step(
        self, server_round: int, current: NDArray, mean: NDArray, m: NDArray, v: NDArray
    ) -> tuple[NDArray, NDArray, NDArray]:
        """One array's ``(new, m, v)`` from its current value, its mean and its moments."""

    def state(self) -> RecordDict:
        """The moments (``m_t``, ``v_t``): what the next step starts from."""
        return states_record({"m_t": self.m_t, "v_t": self.v_t})

    def load_state(self, state: RecordDict) -> None:
        load_states(type(self).__name__, state, {"m_t": self.m_t, "v_t": self.v_t})

    def server_update(self, server_round: int, aggregated: ArrayRecord) -> ArrayRecord:
        if self.current_arrays is None:
            raise RuntimeError(
                f"{type(self).__name__} has no model to step from: call configure_train first"
            )
        return ArrayRecord(
            step_floats(
                self.current_arrays,
                aggregated,
                {"m_t": self.m_t, "v_t": self.v_t},
                lambda key, current, mean: self._step(server_round, key, current, mean),
            )
        )

    def _step(self, server_round: int, key: str, current: NDArray, mean: NDArray) -> NDArray:
        zeros = np.zeros(current.shape, current.dtype)
        new, m, self.v_t[key] = self.adaptive_step(
            server_round, current, mean, self.m_t.get(key, zeros), self.v_t.get(key, zeros)
        )
        if self.beta_1 > 0.0:
            self.m_t[key] = m
        return new
