"""Legacy ``DPFedAvgFixed`` and ``DPFedAvgAdaptive``: Flower's older (deprecated) DP wrappers.

The clients (Flower's ``DPFedAvgNumPyClient``) clip their update to the
``"dpfedavg_clip_norm"`` sent and, with adaptive clipping, report
``"dpfedavg_norm_bit"``, true when they did not clip. With ``server_side_noising``
the server adds to each result noise of standard deviation ``z × C / √m``, and every
result weighs one example; otherwise the clients add it (``"dpfedavg_noise_stddev"``
sent). The noise draw and the clipping norm's update are fedcore's
(:func:`fedcore.privacy.add_gaussian_noise`, :func:`~fedcore.strategy.
dp_adaptive_clipping.adapted_clipping_norm`), each round's generator from fresh OS
entropy. A round with failures is not aggregated.
"""

from __future__ import annotations

import logging

import numpy as np

from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.dp_clipping import noised
from fedcore.legacy.strategy.strategy import Strategy
from fedcore.legacy.types import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from fedcore.strategy.dp_adaptive_clipping import adapted_clipping_norm

log = logging.getLogger("flwr")

CLIP_NORM_KEY = "dpfedavg_clip_norm"
NOISE_STDDEV_KEY = "dpfedavg_noise_stddev"
ADAPTIVE_KEY = "dpfedavg_adaptive_clip_enabled"
NORM_BIT_KEY = "dpfedavg_norm_bit"


class DPFedAvgFixed(Strategy):
    """DP-FedAvg (McMahan et al., 2018) with a fixed clipping norm."""

    def __init__(
        self,
        strategy: Strategy,
        num_sampled_clients: int,
        clip_norm: float,
        noise_multiplier: float = 1,
        server_side_noising: bool = True,
    ) -> None:
        log.warning(
            "DEPRECATED FEATURE: the `%s` wrapper; use the DifferentialPrivacy* wrappers",
            type(self).__name__,
        )
        if clip_norm <= 0:
            raise ValueError("The clipping threshold should be a positive value.")
        if noise_multiplier < 0:
            raise ValueError("The noise multiplier should be a non-negative value.")
        self.strategy = strategy
        self.num_sampled_clients = num_sampled_clients
        self.clip_norm = clip_norm
        self.noise_multiplier = noise_multiplier
        self.server_side_noising = server_side_noising

    def __repr__(self) -> str:
        return "Strategy with DP with Fixed Clipping enabled."

    def _calc_client_noise_stddev(self) -> float:
        return float(self.noise_multiplier * self.clip_norm / self.num_sampled_clients**0.5)

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        extra: dict[str, Scalar] = {CLIP_NORM_KEY: self.clip_norm}
        if not self.server_side_noising:
            extra[NOISE_STDDEV_KEY] = self._calc_client_noise_stddev()
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        for _, ins in instructions:
            ins.config.update(extra)
        return instructions

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Each result noised (with ``server_side_noising``) and weighing one example."""
        if failures:
            return None, {}
        std = self._calc_client_noise_stddev() if self.server_side_noising else 0.0
        rng = np.random.default_rng()
        for _, res in results:
            res.num_examples = 1
            res.parameters = ndarrays_to_parameters(
                noised(parameters_to_ndarrays(res.parameters), std, rng)
            )
        return self.strategy.aggregate_fit(server_round, results, failures)

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return self.strategy.evaluate(server_round, parameters)


class DPFedAvgAdaptive(DPFedAvgFixed):
    """DP-FedAvg with the clipping norm adapted to the clients' norm bits."""

    def __init__(
        self,
        strategy: Strategy,
        num_sampled_clients: int,
        init_clip_norm: float = 0.1,
        noise_multiplier: float = 1.0,
        server_side_noising: bool = True,
        clip_norm_lr: float = 0.2,
        clip_norm_target_quantile: float = 0.5,
        clip_count_stddev: float | None = None,
    ) -> None:
        super().__init__(
            strategy=strategy,
            num_sampled_clients=num_sampled_clients,
            clip_norm=init_clip_norm,
            noise_multiplier=noise_multiplier,
            server_side_noising=server_side_noising,
        )
        self.clip_norm_lr = clip_norm_lr
        self.clip_norm_target_quantile = clip_norm_target_quantile
        if clip_count_stddev is None:
            clip_count_stddev = num_sampled_clients / 20.0 if noise_multiplier > 0 else 0.0
        self.clip_count_stddev: float = clip_count_stddev
        if noise_multiplier:
            self.noise_multiplier = (
                self.noise_multiplier**-2 - (2 * self.clip_count_stddev) ** -2
            ) ** -0.5

    def __repr__(self) -> str:
        return "Strategy with DP with Adaptive Clipping enabled."

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        instructions = super().configure_fit(server_round, parameters, client_manager)
        for _, ins in instructions:
            ins.config[ADAPTIVE_KEY] = True
        return instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if failures:
            return None, {}
        new_model = super().aggregate_fit(server_round, results, failures)
        unclipped = 0
        for proxy, res in results:
            if NORM_BIT_KEY not in res.metrics:
                raise KeyError(f"Indicator bit not returned by client with id {proxy.cid}.")
            unclipped += bool(res.metrics[NORM_BIT_KEY])
        if results:
            self.clip_norm = adapted_clipping_norm(
                self.clip_norm,
                len(results),
                unclipped,
                clip_norm_lr=self.clip_norm_lr,
                target_clipped_quantile=self.clip_norm_target_quantile,
                clipped_count_stddev=self.clip_count_stddev,
                rng=np.random.default_rng(),
            )
        return new_model
