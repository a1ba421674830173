"""Legacy central-DP wrappers: ``DifferentialPrivacy{Server,Client}Side{Fixed,Adaptive}Clipping``.

They wrap a legacy strategy as Flower's do, and compute with fedcore's privacy
primitives (:mod:`fedcore.privacy`: the update's clipping, the noise's standard
deviation and draw; :mod:`fedcore.strategy.dp_adaptive_clipping`: the budget split
and the clipping norm's update), which the Message-API wrappers use too. As those,
and unlike Flower's legacy ones (docs/from-flower.md): the adaptive norm moves
towards the target quantile of *unclipped* updates, the round's noise is calibrated
to the norm it clipped to (the norm adapts after), and with ``seed`` the noise of
round r comes from a generator made from ``[seed, r]`` (the count's from ``[seed, r,
1]``); without, from fresh OS entropy. A round with failures is not aggregated, as
in Flower.
"""

from __future__ import annotations

import logging

import numpy as np

from fedcore.domain import ArrayRecord
from fedcore.domain.array import NDArrays
from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.aggregate import ndarrays
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
from fedcore.privacy import CLIPPING_NORM_KEY, NORM_BIT_KEY, add_gaussian_noise, clip_update
from fedcore.privacy import noise_std as central_noise_std
from fedcore.strategy.dp_adaptive_clipping import adapted_clipping_norm, adaptive_noise

log = logging.getLogger("flwr")


def noised(arrays: NDArrays, std: float, rng: np.random.Generator) -> NDArrays:
    """``arrays`` plus N(0, std²) on every element (:func:`fedcore.privacy.add_gaussian_noise`)."""
    return ndarrays(add_gaussian_noise(ArrayRecord(list(arrays)), std, rng))


def clipped(model: NDArrays, sent: NDArrays, clipping_norm: float) -> tuple[NDArrays, bool]:
    """``model`` with its update from ``sent`` clipped to ``clipping_norm``; whether it was
    longer (:func:`fedcore.privacy.clip_update`)."""
    outcome = clip_update(ArrayRecord(list(model)), ArrayRecord(list(sent)), clipping_norm)
    return ndarrays(outcome.arrays), outcome.clipped


class _Wrapper(Strategy):
    """Delegation to the wrapped strategy, and the round's noise on its aggregate."""

    def __init__(
        self,
        strategy: Strategy,
        noise_multiplier: float,
        clipping_norm: float,
        num_sampled_clients: int,
        *,
        seed: int | None = None,
    ) -> None:
        if noise_multiplier < 0:
            raise ValueError("The noise multiplier should be a non-negative value.")
        if clipping_norm <= 0:
            raise ValueError("The clipping norm should be a positive value.")
        if num_sampled_clients <= 0:
            raise ValueError("The number of sampled clients should be a positive value.")
        self.strategy = strategy
        self.noise_multiplier = noise_multiplier
        self.clipping_norm = clipping_norm
        self.num_sampled_clients = num_sampled_clients
        self.seed = seed
        self.current_round_params: NDArrays = []  # the model sent, for server-side clipping

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return self.strategy.configure_fit(server_round, parameters, client_manager)

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

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

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if failures:
            return None, {}
        if len(results) != self.num_sampled_clients:
            log.warning(
                "The number of clients returning parameters (%s) differs from the number "
                "of sampled clients (%s). This could impact the differential privacy "
                "guarantees of the system, potentially leading to privacy leakage or "
                "inadequate noise calibration.",
                len(results),
                self.num_sampled_clients,
            )
        self.prepare(server_round, results)
        aggregated, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        if aggregated is not None:
            std = central_noise_std(
                self.noise_multiplier, self.clipping_norm, self.num_sampled_clients
            )
            rng = np.random.default_rng(None if self.seed is None else [self.seed, server_round])
            aggregated = ndarrays_to_parameters(
                noised(parameters_to_ndarrays(aggregated), std, rng)
            )
            log.info("aggregate_fit: central DP noise with %.4f stdev added", std)
        self.adapt(server_round, results)
        return aggregated, metrics

    def prepare(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]) -> None:
        """Change the results before the wrapped strategy aggregates them (here: none)."""

    def adapt(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]) -> None:
        """After the round's noise: update the clipping norm (here: it is fixed)."""


class DifferentialPrivacyServerSideFixedClipping(_Wrapper):
    """Central DP, each update clipped by the server to ``clipping_norm``."""

    def __repr__(self) -> str:
        return "Differential Privacy Strategy Wrapper (Server-Side Fixed Clipping)"

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        self.current_round_params = parameters_to_ndarrays(parameters)
        return super().configure_fit(server_round, parameters, client_manager)

    def prepare(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]) -> None:
        """Each result's update clipped, in place in its ``FitRes`` (as Flower's)."""
        for _, res in results:
            model, _ = clipped(
                parameters_to_ndarrays(res.parameters),
                self.current_round_params,
                self.clipping_norm,
            )
            res.parameters = ndarrays_to_parameters(model)
        log.info("aggregate_fit: parameters are clipped by value: %.4f.", self.clipping_norm)


class DifferentialPrivacyClientSideFixedClipping(_Wrapper):
    """Central DP; the clients clip (``fixedclipping_mod``) to the ``"clipping_norm"`` sent."""

    def __repr__(self) -> str:
        return "Differential Privacy Strategy Wrapper (Client-Side Fixed Clipping)"

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        instructions = super().configure_fit(server_round, parameters, client_manager)
        for _, ins in instructions:
            ins.config[CLIPPING_NORM_KEY] = self.clipping_norm
        return instructions


class _Adaptive(_Wrapper):
    """The clipping norm adapts each round to the target quantile of the update norms."""

    def __init__(
        self,
        strategy: Strategy,
        noise_multiplier: float,
        num_sampled_clients: int,
        initial_clipping_norm: float = 0.1,
        target_clipped_quantile: float = 0.5,
        clip_norm_lr: float = 0.2,
        clipped_count_stddev: float | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        if not 0 <= target_clipped_quantile <= 1:
            raise ValueError("The target clipped quantile must be between 0 and 1 (inclusive).")
        if clip_norm_lr <= 0:
            raise ValueError("The learning rate must be positive.")
        if clipped_count_stddev is not None and clipped_count_stddev < 0:
            raise ValueError("The `clipped_count_stddev` must be non-negative.")
        super().__init__(
            strategy, noise_multiplier, initial_clipping_norm, num_sampled_clients, seed=seed
        )
        self.target_clipped_quantile = target_clipped_quantile
        self.clip_norm_lr = clip_norm_lr
        self.clipped_count_stddev, self.noise_multiplier = adaptive_noise(
            noise_multiplier, num_sampled_clients, clipped_count_stddev
        )
        self._unclipped = 0

    def adapt(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]) -> None:
        if not results:
            return
        entropy = None if self.seed is None else [self.seed, server_round, 1]
        self.clipping_norm = adapted_clipping_norm(
            self.clipping_norm,
            len(results),
            self._unclipped,
            clip_norm_lr=self.clip_norm_lr,
            target_clipped_quantile=self.target_clipped_quantile,
            clipped_count_stddev=self.clipped_count_stddev,
            rng=np.random.default_rng(entropy),
        )


class DifferentialPrivacyServerSideAdaptiveClipping(_Adaptive):
    """Central DP with adaptive clipping done by the server."""

    def __repr__(self) -> str:
        return "Differential Privacy Strategy Wrapper (Server-Side Adaptive Clipping)"

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        self.current_round_params = parameters_to_ndarrays(parameters)
        return super().configure_fit(server_round, parameters, client_manager)

    def prepare(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]) -> None:
        """Each result's update clipped in place, the unclipped ones counted."""
        self._unclipped = 0
        for _, res in results:
            model, scaled = clipped(
                parameters_to_ndarrays(res.parameters),
                self.current_round_params,
                self.clipping_norm,
            )
            res.parameters = ndarrays_to_parameters(model)
            self._unclipped += not scaled


class DifferentialPrivacyClientSideAdaptiveClipping(_Adaptive):
    """Central DP with adaptive clipping done by the clients (``adaptiveclipping_mod``),
    each reporting in its metrics ``"norm_bit"``: 1 if it clipped."""

    def __repr__(self) -> str:
        return "Differential Privacy Strategy Wrapper (Client-Side Adaptive Clipping)"

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        instructions = super().configure_fit(server_round, parameters, client_manager)
        for _, ins in instructions:
            ins.config[CLIPPING_NORM_KEY] = self.clipping_norm
        return instructions

    def prepare(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]) -> None:
        """The unclipped results counted by their ``"norm_bit"``; ``KeyError`` if one lacks it."""
        self._unclipped = 0
        for proxy, res in results:
            if NORM_BIT_KEY not in res.metrics:
                raise KeyError(f"{NORM_BIT_KEY} not returned by client with id {proxy.cid}.")
            self._unclipped += not res.metrics[NORM_BIT_KEY]
