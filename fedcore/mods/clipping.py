"""``fixedclipping_mod``: the node's half of central DP with client-side fixed clipping.

On the server, ``DifferentialPrivacyClientSideFixedClipping`` (in
:mod:`fedcore.strategy.dp_fixed_clipping`) puts the clipping norm into every
training message's config under ``"clipping_norm"``
(:data:`~fedcore.privacy.CLIPPING_NORM_KEY`, Flower's key) and adds the noise after
aggregating. This mod, on the node, runs the handler and clips the update — the
reply's arrays minus the arrays the message brought — to that norm, so an update
longer than the norm never leaves the node.

It acts on training messages (``train`` and ``train.<action>``) and passes every
other message through. Put it before (outside) any mod that changes arrays in the
list, so that it compares the arrays that arrived with the arrays that leave.
"""

from __future__ import annotations

import logging

from fedcore.apps.client_app import CallNext
from fedcore.domain import ArrayRecord, Context, Message, RecordDict
from fedcore.privacy import CLIPPING_NORM_KEY, clip_update

log = logging.getLogger(__name__)


def fixedclipping_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Clip the update of a training reply to the norm the server sent.

    The message must carry one ArrayRecord (the arrays sent) and ``"clipping_norm"``
    in a ConfigRecord; without them the node answers with an error reply that says
    what is missing, before the handler runs. Every ArrayRecord of the reply is
    clipped relative to the arrays sent; error replies pass through untouched.
    """
    if msg.metadata.message_type.partition(".")[0] != "train":
        return call_next(msg, context)
    clipping_norm = _clipping_norm(msg.content)
    sent = _sent_arrays(msg.content)
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    content = RecordDict()
    changed = False
    for name, record in reply.content.items():
        if isinstance(record, ArrayRecord):
            clipped = clip_update(record, sent, clipping_norm)
            log.debug(
                "fixedclipping_mod: update %r of norm %.4g scaled by %.4g to at most %.4g",
                name,
                clipped.norm,
                clipped.scale,
                clipping_norm,
            )
            changed = changed or clipped.clipped
            record = clipped.arrays
        content[name] = record
    return reply.with_content(content) if changed else reply


def _clipping_norm(content: RecordDict) -> float:
    for config in content.config_records.values():
        if CLIPPING_NORM_KEY in config:
            value = config[CLIPPING_NORM_KEY]
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(
                    f"fixedclipping_mod: {CLIPPING_NORM_KEY!r} must be a number > 0, got {value!r}"
                )
            return float(value)
    raise ValueError(
        f"fixedclipping_mod: the train message has no {CLIPPING_NORM_KEY!r} in its config; "
        "the server's strategy must be wrapped in DifferentialPrivacyClientSideFixedClipping"
    )


def _sent_arrays(content: RecordDict) -> ArrayRecord:
    """The arrays the message brought, kept apart from the handler: a writable array is
    copied, in case the handler updates it in place; read-only ones are shared."""
    records = list(content.array_records.values())
    if len(records) != 1:
        raise ValueError(
            f"fixedclipping_mod: a train message must carry one ArrayRecord, found {len(records)}"
        )
    return ArrayRecord(
        {key: array.copy() if array.flags.writeable else array for key, array in records[0].items()}
    )
