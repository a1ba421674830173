"""The node's half of central DP with client-side clipping: fixed or adaptive.

The server's wrapper (:mod:`fedcore.strategy.dp_fixed_clipping`,
:mod:`fedcore.strategy.dp_adaptive_clipping`) puts the clipping norm into every
training message's config under ``"clipping_norm"``
(:data:`~fedcore.privacy.CLIPPING_NORM_KEY`, Flower's key) and adds the noise after
aggregating; the mods here clip the update (the reply's arrays minus the arrays the
message brought) on the node, so an update longer than the norm never leaves it.
:func:`adaptiveclipping_mod` also adds ``"norm_bit"`` (1 if it clipped, else 0) to the
reply's one MetricRecord, which the adaptive strategy needs to move its norm. Both act
on training messages only; put them before (outside) any mod that changes arrays, so
they compare the arrays that arrived with the arrays that leave.
"""

from __future__ import annotations

import logging

from fedcore.apps.client_app import CallNext
from fedcore.domain import ArrayRecord, Context, Message, MetricRecord, RecordDict
from fedcore.privacy import CLIPPING_NORM_KEY, NORM_BIT_KEY, clip_update

log = logging.getLogger(__name__)

_WRAPPERS = {
    "fixedclipping_mod": "DifferentialPrivacyClientSideFixedClipping",
    "adaptiveclipping_mod": "DifferentialPrivacyClientSideAdaptiveClipping",
}


def fixedclipping_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Clip the update of a training reply to the norm the server sent.

    The message must carry one ArrayRecord (the arrays sent) and ``"clipping_norm"``
    in a ConfigRecord; without them the node answers with an error reply that says
    what is missing, before the handler runs. Every ArrayRecord of the reply is
    clipped relative to the arrays sent; error replies pass through untouched.
    """
    if msg.metadata.message_type.partition(".")[0] != "train":
        return call_next(msg, context)
    reply, _ = _clipped_reply(msg, context, call_next, "fixedclipping_mod")
    return reply


def adaptiveclipping_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Clip a training reply's update as :func:`fixedclipping_mod` does, and report in
    its metrics whether it had to: ``"norm_bit"`` 1 if the update was longer than the
    norm, else 0 — what the server's adaptive clipping moves the norm by.

    The reply must carry exactly one MetricRecord, for the bit (FedAvg's replies do);
    otherwise the node answers with an error reply saying so.
    """
    if msg.metadata.message_type.partition(".")[0] != "train":
        return call_next(msg, context)
    reply, scaled = _clipped_reply(msg, context, call_next, "adaptiveclipping_mod")
    if reply.has_error():
        return reply
    names = list(reply.content.metric_records)
    if len(names) != 1:
        raise ValueError(
            f"adaptiveclipping_mod: the reply must carry one MetricRecord for {NORM_BIT_KEY!r}, "
            f"found {len(names)}"
        )
    content = RecordDict(reply.content)
    metrics = reply.content.metric_records[names[0]]
    content[names[0]] = MetricRecord({**metrics, NORM_BIT_KEY: int(scaled)})
    return reply.with_content(content)


def _clipped_reply(
    msg: Message, context: Context, call_next: CallNext, mod: str
) -> tuple[Message, bool]:
    """The handler's reply with every ArrayRecord's update clipped to the norm ``msg``
    brought, and whether any was longer than it."""
    clipping_norm = _clipping_norm(msg.content, mod)
    sent = sent_arrays(msg.content, mod)
    reply = call_next(msg, context)
    if reply.has_error():
        return reply, False
    content = RecordDict()
    changed = False
    for name, record in reply.content.items():
        if isinstance(record, ArrayRecord):
            clipped = clip_update(record, sent, clipping_norm)
            log.debug(
                "%s: update %r of norm %.4g scaled by %.4g to at most %.4g",
                mod,
                name,
                clipped.norm,
                clipped.scale,
                clipping_norm,
            )
            changed = changed or clipped.clipped
            record = clipped.arrays
        content[name] = record
    return (reply.with_content(content) if changed else reply), changed


def _clipping_norm(content: RecordDict, mod: str) -> float:
    for config in content.config_records.values():
        if CLIPPING_NORM_KEY in config:
            value = config[CLIPPING_NORM_KEY]
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(
                    f"{mod}: {CLIPPING_NORM_KEY!r} must be a number > 0, got {value!r}"
                )
            return float(value)
    raise ValueError(
        f"{mod}: the train message has no {CLIPPING_NORM_KEY!r} in its config; the server's "
        f"strategy must be wrapped in {_WRAPPERS[mod]}"
    )


def sent_arrays(content: RecordDict, mod: str) -> ArrayRecord:
    """The arrays the message brought, kept apart from the handler: a writable array is
    copied, in case the handler updates it in place; read-only ones are shared."""
    records = list(content.array_records.values())
    if len(records) != 1:
        raise ValueError(f"{mod}: a train message must carry one ArrayRecord, found {len(records)}")
    return ArrayRecord(
        {key: array.copy() if array.flags.writeable else array for key, array in records[0].items()}
    )
