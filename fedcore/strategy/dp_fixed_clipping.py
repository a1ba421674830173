"""Central differential privacy with fixed clipping, as wrappers around any strategy.

Papers: McMahan et al., 2018 (https://arxiv.org/abs/1710.06963) and Geyer et al.,
2017 (https://arxiv.org/abs/1712.07557). Each node's update (the arrays it returns
minus the arrays it was sent) is clipped to an L2 norm of at most
``clipping_norm``; the wrapped strategy aggregates the clipped replies; Gaussian
noise of standard deviation ``noise_multiplier × clipping_norm /
num_sampled_clients`` is added to the aggregate. Arguments follow Flower 1.42's
wrappers of the same names:

- :class:`DifferentialPrivacyServerSideFixedClipping` clips on the server, each
  reply relative to the arrays the latest ``configure_train`` was given;
- :class:`DifferentialPrivacyClientSideFixedClipping` sends the norm to the nodes in
  the training config (key ``"clipping_norm"``), whose ClientApp must clip with
  :func:`fedcore.mods.fixedclipping_mod`, and adds only the noise.

The noise is calibrated to a mean of ``num_sampled_clients`` updates, each weighing
the same: set it to the number of nodes the wrapped strategy samples per round, and
prefer equal weights (a weighted mean lets a heavy node move the aggregate by more
than ``clipping_norm / num_sampled_clients``). A round that aggregates another
number of replies logs a warning. Error replies are never aggregated, nor are
replies the server cannot clip (arrays that do not match the ones sent, NaN or
infinite entries), which are logged.

Both wrappers work whether the wrapped strategy folds replies as they arrive
(``train_aggregation`` returns an :class:`~fedcore.strategy.protocol.Aggregation`, as
FedAvg does) or takes them as a list (it returns ``None``, as a median does).
``configure_evaluate``, ``aggregate_evaluate`` and ``min_nodes`` are the wrapped
strategy's own.

Noise comes from a numpy generator made per round: from ``[seed, server_round]``
when ``seed`` is given — the same seed gives the same noise in the same round,
however often the strategy is started — and from fresh OS entropy otherwise, which
is what a real deployment wants (a seed an adversary can learn makes the noise
removable).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.privacy import CLIPPING_NORM_KEY, add_gaussian_noise, clip_update, noise_std
from fedcore.strategy import arguments
from fedcore.strategy.base import Strategy
from fedcore.strategy.protocol import Aggregation
from fedcore.strategy.result import Phase
from fedcore.strategy.sampling import Nodes

log = logging.getLogger("fedcore.strategy")


class _FixedClipping(Strategy):
    """What both wrappers share: delegation, dropping error replies, and the noise."""

    def __init__(
        self,
        strategy: Strategy,
        noise_multiplier: float,
        clipping_norm: float,
        num_sampled_clients: int,
        *,
        seed: int | None = None,
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a Strategy, got {type(strategy).__name__}")
        if type(strategy).drive is not Strategy.drive:
            # Its own schedule (FedBuff's) would call its methods, not the wrapper's.
            raise TypeError(
                f"{type(strategy).__name__} runs its own schedule; the differential-privacy "
                "wrappers work with round-based strategies only"
            )
        self.strategy = strategy
        self.round_timeout = strategy.round_timeout
        self.noise_multiplier = arguments.non_negative("noise_multiplier", noise_multiplier)
        self.clipping_norm = arguments.positive("clipping_norm", clipping_norm)
        self.num_sampled_clients = arguments.count(
            "num_sampled_clients", num_sampled_clients, minimum=1
        )
        self.seed = None if seed is None else arguments.count("seed", seed)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.strategy!r}, "
            f"noise_multiplier={self.noise_multiplier}, clipping_norm={self.clipping_norm}, "
            f"num_sampled_clients={self.num_sampled_clients})"
        )

    def min_nodes(self, phase: Phase) -> int:
        return self.strategy.min_nodes(phase)

    def check_train_reply(self, sent: Message, reply: Message) -> Message:
        """The wrapped strategy's check: its replies are the ones it aggregates."""
        return self.strategy.check_train_reply(sent, reply)

    def state(self) -> RecordDict:
        """The wrapped strategy's state; the noise of each round follows from the seed."""
        return self.strategy.state()

    def load_state(self, state: RecordDict) -> None:
        self.strategy.load_state(state)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, node_ids)

    def aggregate_evaluate(
        self, server_round: int, replies: Sequence[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        inner = self.strategy.train_aggregation(server_round)
        return None if inner is None else _NoisyAggregation(self, server_round, inner)

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        prepared = [
            ready for reply in replies if (ready := self.prepare(server_round, reply)) is not None
        ]
        arrays, metrics = self.strategy.aggregate_train(server_round, prepared)
        return self.add_noise(server_round, arrays, len(prepared)), metrics

    def prepare(self, server_round: int, reply: Message) -> Message | None:
        """The reply as the wrapped strategy should see it, or ``None`` to leave it out
        (here: error replies are left out, everything else passes)."""
        return None if reply.has_error() else reply

    def add_noise(
        self, server_round: int, arrays: ArrayRecord | None, aggregated: int
    ) -> ArrayRecord | None:
        """``arrays`` (the wrapped strategy's aggregate of ``aggregated`` replies) plus
        the round's Gaussian noise."""
        if arrays is None:
            return None
        if aggregated != self.num_sampled_clients:
            log.warning(
                "round %d train: %d replies aggregated, but the noise is calibrated to "
                "num_sampled_clients=%d; the privacy guarantee may not hold as stated",
                server_round,
                aggregated,
                self.num_sampled_clients,
            )
        std = noise_std(self.noise_multiplier, self.clipping_norm, self.num_sampled_clients)
        rng = np.random.default_rng(None if self.seed is None else [self.seed, server_round])
        log.info("round %d train: central DP noise with std %.4g added", server_round, std)
        return add_gaussian_noise(arrays, std, rng)


class _NoisyAggregation(Aggregation):
    """The wrapped strategy's running aggregation, fed prepared replies, noised at the end."""

    def __init__(self, wrapper: _FixedClipping, server_round: int, inner: Aggregation) -> None:
        self._wrapper = wrapper
        self._round = server_round
        self._inner = inner
        self._added = 0

    def add(self, reply: Message) -> None:
        prepared = self._wrapper.prepare(self._round, reply)
        if prepared is None:
            return
        self._inner.add(prepared)
        self._added += 1

    def result(self) -> tuple[ArrayRecord | None, MetricRecord | None]:
        arrays, metrics = self._inner.result()
        return self._wrapper.add_noise(self._round, arrays, self._added), metrics


class DifferentialPrivacyServerSideFixedClipping(_FixedClipping):
    """Central DP with fixed clipping done by the server.

    ::

        strategy = DifferentialPrivacyServerSideFixedClipping(
            FedAvg(fraction_train=0.1), noise_multiplier=1.0, clipping_norm=5.0,
            num_sampled_clients=50,
        )

    Each reply's update is clipped relative to :attr:`current_arrays` before the
    wrapped strategy sees it; the nodes need no mod.
    """

    current_arrays: ArrayRecord | None = None
    """The arrays the latest :meth:`configure_train` sent (``None`` before the first)."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        self.current_arrays = arrays
        return self.strategy.configure_train(server_round, arrays, config, node_ids)

    def prepare(self, server_round: int, reply: Message) -> Message | None:
        """The reply with every ArrayRecord's update clipped (a new message; the reply
        itself is not changed), or ``None`` for an error reply or one that cannot be
        clipped."""
        if reply.has_error():
            return None
        clipped = clip_reply(server_round, reply, self.current_arrays, self.clipping_norm)
        return None if clipped is None else clipped[0]


def clip_reply(
    server_round: int, reply: Message, sent: ArrayRecord | None, clipping_norm: float
) -> tuple[Message, bool] | None:
    """``reply`` with the update of every ArrayRecord clipped relative to ``sent`` (a new
    message; the reply is not changed), and whether any was longer than the norm; or
    ``None``, logged, when it cannot be clipped."""
    if sent is None:
        raise RuntimeError("aggregate_train before configure_train: no arrays were sent")
    content = RecordDict()
    scaled = False
    try:
        for name, record in reply.content.items():
            if isinstance(record, ArrayRecord):
                outcome = clip_update(record, sent, clipping_norm)
                scaled, record = scaled or outcome.clipped, outcome.arrays
            content[name] = record
    except (TypeError, ValueError) as exc:
        log.warning(
            "round %d train: reply from node %d not aggregated: %s",
            server_round,
            reply.metadata.src_node_id,
            exc,
        )
        return None
    return reply.with_content(content), scaled


class DifferentialPrivacyClientSideFixedClipping(_FixedClipping):
    """Central DP with fixed clipping done by the nodes.

    ::

        strategy = DifferentialPrivacyClientSideFixedClipping(
            FedAvg(fraction_train=0.1), noise_multiplier=1.0, clipping_norm=5.0,
            num_sampled_clients=50,
        )
        client = ClientApp(mods=[fixedclipping_mod])

    The training config carries ``"clipping_norm"``; the server trusts the nodes to
    clip and adds the noise.
    """

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        config = ConfigRecord(config)
        config[CLIPPING_NORM_KEY] = self.clipping_norm
        return self.strategy.configure_train(server_round, arrays, config, node_ids)
