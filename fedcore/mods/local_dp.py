"""``LocalDpMod``: local differential privacy — a node clips and noises its own update.

Unlike central DP (:mod:`fedcore.strategy.dp_fixed_clipping`), nothing is trusted to
the server: before a training reply leaves the node, its update (the reply's arrays
minus the arrays the message brought) is clipped to an L2 norm of at most
``clipping_norm``, and Gaussian noise of standard deviation
σ = ``sensitivity`` × √(2 ln(1.25 / ``delta``)) / ``epsilon`` (the classical Gaussian
mechanism, Dwork and Roth, 2014, theorem A.1; (ε, δ) per reply for ε < 1) is added to
every element. Arguments follow Flower 1.42's ``LocalDpMod``, an instance used as a
mod: ``ClientApp(mods=[LocalDpMod(clipping_norm=1.0, sensitivity=1.0, epsilon=1.0,
delta=1e-5)])``. Choose ``sensitivity`` to bound how much one record of the node's
data can move its update (clipping alone bounds any change of the whole update by
2 × ``clipping_norm``). It acts on training messages, which must bring one
ArrayRecord, and clips and noises every ArrayRecord of the reply; other messages and
error replies pass untouched. Noise comes from a generator per mod,
seeded with ``seed`` when given (tests), else from OS entropy, which privacy needs.
"""

from __future__ import annotations

import logging
import math
import threading

import numpy as np

from fedcore.apps.client_app import CallNext
from fedcore.domain import ArrayRecord, Context, Message, RecordDict
from fedcore.mods.clipping import sent_arrays
from fedcore.privacy import add_gaussian_noise, clip_update

log = logging.getLogger(__name__)


class LocalDpMod:
    """A mod that clips each training update and adds Gaussian noise on the node."""

    def __init__(
        self,
        clipping_norm: float,
        sensitivity: float,
        epsilon: float,
        delta: float,
        *,
        seed: int | None = None,
    ) -> None:
        self.clipping_norm = _number("clipping_norm", clipping_norm, low=0.0, low_open=True)
        self.sensitivity = _number("sensitivity", sensitivity, low=0.0)
        self.epsilon = _number("epsilon", epsilon, low=0.0, low_open=True)
        self.delta = _number("delta", delta, low=0.0, low_open=True)
        if not self.delta < 1:
            raise ValueError(f"delta must be below 1, got {delta!r}")
        self.std = self.sensitivity * math.sqrt(2 * math.log(1.25 / self.delta)) / self.epsilon
        """The noise's standard deviation, σ of the Gaussian mechanism."""
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()  # ClientApps of one process may run in threads

    def __repr__(self) -> str:
        return (
            f"LocalDpMod(clipping_norm={self.clipping_norm}, sensitivity={self.sensitivity}, "
            f"epsilon={self.epsilon}, delta={self.delta})"
        )

    def __call__(self, msg: Message, context: Context, call_next: CallNext) -> Message:
        """Clip and noise the reply to a training message."""
        if msg.metadata.message_type.partition(".")[0] != "train":
            return call_next(msg, context)
        sent = sent_arrays(msg.content, "LocalDpMod")
        reply = call_next(msg, context)
        if reply.has_error():
            return reply
        content = RecordDict()
        for name, record in reply.content.items():
            if isinstance(record, ArrayRecord):
                clipped = clip_update(record, sent, self.clipping_norm)
                with self._lock:
                    record = add_gaussian_noise(clipped.arrays, self.std, self._rng)
                log.info(
                    "LocalDpMod: update %r of norm %.4g clipped to %.4g, noise std %.4g added",
                    name,
                    clipped.norm,
                    self.clipping_norm,
                    self.std,
                )
            content[name] = record
        return reply.with_content(content)


def _number(name: str, value: object, *, low: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (low_open and value == low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value!r}")
    return float(value)
