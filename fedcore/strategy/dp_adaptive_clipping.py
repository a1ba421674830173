"""Central differential privacy with adaptive clipping, as wrappers around any strategy.

Paper: Andrew et al., 2021, "Differentially Private Learning with Adaptive Clipping"
(https://arxiv.org/abs/1905.03871). As with fixed clipping
(:mod:`fedcore.strategy.dp_fixed_clipping`, whose machinery these wrappers reuse),
each node's update is clipped to an L2 norm of at most C and Gaussian noise is added
to the aggregate; here C moves every round towards the ``target_clipped_quantile`` γ
of the update norms, privately:

- each reply counts one bit b = 1 if its update was no longer than C (left unclipped);
- the noised fraction b̃ = (Σ b + N(0, σ_b²)) / n over the n replies aggregated, with
  σ_b = ``clipped_count_stddev`` (default ``num_sampled_clients / 20``, the paper's
  advice, when there is noise at all);
- the geometric update C ← C · exp(−η (b̃ − γ)), η = ``clip_norm_lr``: too many
  updates under C shrink it, too many over it grow it.

The privacy budget is split between the count and the updates: the updates' noise
multiplier is z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) for the requested ``noise_multiplier`` z
(which must therefore be below 2σ_b), and the aggregate gets noise of standard
deviation z_Δ × C / ``num_sampled_clients``, C being the norm the round clipped to;
C is updated after. ``noise_multiplier`` holds z_Δ once built.

Arguments follow Flower 1.42's wrappers of the same names. Where Flower's differ from
the paper, fedcore follows the paper: Flower compares the fraction of *clipped*
updates with γ (which moves C away from the target instead of towards it) and
calibrates the round's noise to the norm already updated.

- :class:`DifferentialPrivacyServerSideAdaptiveClipping` clips on the server;
- :class:`DifferentialPrivacyClientSideAdaptiveClipping` sends C to the nodes in the
  training config (``"clipping_norm"``); their ClientApp clips with
  :func:`fedcore.mods.adaptiveclipping_mod`, which reports in the reply's metrics
  ``"norm_bit"`` = 1 if it clipped (Flower's key and meaning), 0 if not.

With ``seed``, the updates' noise of round r comes from a generator made from
``[seed, r]`` (as fixed clipping's) and the count's from ``[seed, r, 1]``; without,
both from fresh OS entropy.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from fedcore.domain import ArrayRecord, ConfigRecord, Message, RecordDict
from fedcore.privacy import CLIPPING_NORM_KEY, NORM_BIT_KEY
from fedcore.strategy import arguments
from fedcore.strategy.base import Strategy
from fedcore.strategy.dp_fixed_clipping import _FixedClipping, clip_reply
from fedcore.strategy.sampling import Nodes

log = logging.getLogger("fedcore.strategy")


def adaptive_noise(
    noise_multiplier: float, num_sampled_clients: int, clipped_count_stddev: float | None
) -> tuple[float, float]:
    """(σ_b, z_Δ): the count's noise std and the updates' noise multiplier for a
    requested ``noise_multiplier`` z (Andrew et al., section 3.1)."""
    if noise_multiplier == 0:
        return (0.0 if clipped_count_stddev is None else clipped_count_stddev), 0.0
    stddev = num_sampled_clients / 20 if clipped_count_stddev is None else clipped_count_stddev
    if not noise_multiplier < 2 * stddev:
        raise ValueError(
            f"noise_multiplier ({noise_multiplier}) must be below 2 × clipped_count_stddev "
            f"({2 * stddev:g}); raise clipped_count_stddev (default num_sampled_clients / 20)"
        )
    return stddev, (noise_multiplier**-2 - (2 * stddev) ** -2) ** -0.5


_NORM_STATE = "adaptive-clipping"
"""The name of the clipping norm's record in an adaptive wrapper's state."""


def adapted_clipping_norm(
    clipping_norm: float,
    counted: int,
    unclipped: int,
    *,
    clip_norm_lr: float,
    target_clipped_quantile: float,
    clipped_count_stddev: float,
    rng: np.random.Generator,
) -> float:
    """C · exp(−η (b̃ − γ)): the next clipping norm, b̃ = (``unclipped`` + N(0, σ_b²)) /
    ``counted`` the noised fraction of updates left unclipped (no draw when σ_b is 0)."""
    noise = float(rng.normal(0.0, clipped_count_stddev)) if clipped_count_stddev > 0 else 0.0
    fraction = (unclipped + noise) / counted
    return clipping_norm * math.exp(-clip_norm_lr * (fraction - target_clipped_quantile))


class _AdaptiveClipping(_FixedClipping):
    """What both wrappers share: the bits' tally per round and the norm's update."""

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
        initial_clipping_norm = arguments.positive("initial_clipping_norm", initial_clipping_norm)
        super().__init__(
            strategy, noise_multiplier, initial_clipping_norm, num_sampled_clients, seed=seed
        )
        self.initial_clipping_norm = self.clipping_norm
        self.target_clipped_quantile = arguments.fraction(
            "target_clipped_quantile", target_clipped_quantile
        )
        self.clip_norm_lr = arguments.positive("clip_norm_lr", clip_norm_lr)
        if clipped_count_stddev is not None:
            clipped_count_stddev = arguments.non_negative(
                "clipped_count_stddev", clipped_count_stddev
            )
        self.clipped_count_stddev, self.noise_multiplier = adaptive_noise(
            self.noise_multiplier, self.num_sampled_clients, clipped_count_stddev
        )
        self._tally: dict[int, tuple[int, int]] = {}
        """Per round not yet aggregated: (replies counted, of which unclipped)."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.strategy!r}, "
            f"noise_multiplier={self.noise_multiplier}, clipping_norm={self.clipping_norm}, "
            f"target_clipped_quantile={self.target_clipped_quantile}, "
            f"clip_norm_lr={self.clip_norm_lr}, num_sampled_clients={self.num_sampled_clients})"
        )

    def state(self) -> RecordDict:
        """The wrapped strategy's state and the clipping norm the rounds so far adapted."""
        state = self.strategy.state()
        if _NORM_STATE in state:
            raise ValueError(f"{self.strategy!r} keeps a state named {_NORM_STATE!r} already")
        state[_NORM_STATE] = ConfigRecord({"clipping_norm": self.clipping_norm})
        return state

    def load_state(self, state: RecordDict) -> None:
        inner = RecordDict({name: record for name, record in state.items() if name != _NORM_STATE})
        norm = state.get(_NORM_STATE)
        value = None if not isinstance(norm, ConfigRecord) else norm.get("clipping_norm")
        if not isinstance(value, float):
            raise ValueError(f"{type(self).__name__}'s state has no clipping norm")
        self.strategy.load_state(inner)
        self.clipping_norm = value

    def count(self, server_round: int, unclipped: bool) -> None:
        """Tally one aggregated reply's bit."""
        counted, under = self._tally.get(server_round, (0, 0))
        self._tally[server_round] = (counted + 1, under + int(unclipped))

    def add_noise(
        self, server_round: int, arrays: ArrayRecord | None, aggregated: int
    ) -> ArrayRecord | None:
        """The round's noise, calibrated to the norm it clipped to; then the norm's update."""
        noisy = super().add_noise(server_round, arrays, aggregated)
        counted, unclipped = self._tally.pop(server_round, (0, 0))
        if counted:
            self.update_clipping_norm(server_round, counted, unclipped)
        return noisy

    def update_clipping_norm(self, server_round: int, counted: int, unclipped: int) -> None:
        """C ← C · exp(−η (b̃ − γ)), b̃ the noised fraction of the replies left unclipped."""
        entropy = None if self.seed is None else [self.seed, server_round, 1]
        previous = self.clipping_norm
        self.clipping_norm = adapted_clipping_norm(
            previous,
            counted,
            unclipped,
            clip_norm_lr=self.clip_norm_lr,
            target_clipped_quantile=self.target_clipped_quantile,
            clipped_count_stddev=self.clipped_count_stddev,
            rng=np.random.default_rng(entropy),
        )
        log.info(
            "round %d train: %d of %d updates unclipped; clipping norm %.4g -> %.4g",
            server_round,
            unclipped,
            counted,
            previous,
            self.clipping_norm,
        )


class DifferentialPrivacyServerSideAdaptiveClipping(_AdaptiveClipping):
    """Central DP with adaptive clipping done by the server.

    ::

        strategy = DifferentialPrivacyServerSideAdaptiveClipping(
            FedAvg(fraction_train=0.1), noise_multiplier=1.0, num_sampled_clients=50,
        )

    Each reply's update is clipped relative to :attr:`current_arrays` with the
    round's :attr:`clipping_norm`, which then adapts; the nodes need no mod.
    """

    current_arrays: ArrayRecord | None = None
    """The arrays the latest :meth:`configure_train` sent (``None`` before the first)."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        self.current_arrays = arrays
        return self.strategy.configure_train(server_round, arrays, config, node_ids)

    def prepare(self, server_round: int, reply: Message) -> Message | None:
        """The reply clipped (a new message), its bit counted; ``None`` for an error reply
        or one that cannot be clipped, which count for nothing."""
        if reply.has_error():
            return None
        clipped = clip_reply(server_round, reply, self.current_arrays, self.clipping_norm)
        if clipped is None:
            return None
        prepared, scaled = clipped
        self.count(server_round, unclipped=not scaled)
        return prepared


class DifferentialPrivacyClientSideAdaptiveClipping(_AdaptiveClipping):
    """Central DP with adaptive clipping done by the nodes.

    ::

        strategy = DifferentialPrivacyClientSideAdaptiveClipping(
            FedAvg(fraction_train=0.1), noise_multiplier=1.0, num_sampled_clients=50,
        )
        client = ClientApp(mods=[adaptiveclipping_mod])

    The training config carries the round's ``"clipping_norm"``; each reply's
    ``"norm_bit"`` metric says whether its node clipped. A reply without it is left
    out, with a warning: its node did not clip (no mod), so aggregating it would
    break the bound.
    """

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        config = ConfigRecord(config)
        config[CLIPPING_NORM_KEY] = self.clipping_norm
        return self.strategy.configure_train(server_round, arrays, config, node_ids)

    def prepare(self, server_round: int, reply: Message) -> Message | None:
        if reply.has_error():
            return None
        bits = [
            record[NORM_BIT_KEY]
            for record in reply.content.metric_records.values()
            if NORM_BIT_KEY in record
        ]
        if len(bits) != 1 or bits[0] not in (0, 1):
            log.warning(
                "round %d train: reply from node %d not aggregated: it needs one %r metric "
                "of 0 or 1 (adaptiveclipping_mod in the ClientApp's mods), found %s",
                server_round,
                reply.metadata.src_node_id,
                NORM_BIT_KEY,
                bits,
            )
            return None
        self.count(server_round, unclipped=bits[0] == 0)
        return reply
