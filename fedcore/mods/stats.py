"""``message_stats_mod``: message sizes and handler time, in the reply's metrics.

Adds three metrics to every successful reply:

- ``incoming-message-bytes`` — the encoded size of the message as this mod received it;
- ``outgoing-message-bytes`` — the encoded size of the reply as ``call_next`` returned it
  (before these three metrics were added, and before the node stamps the reply's id);
- ``handler-seconds`` — the wall time ``call_next`` took: the handler and any mods
  after this one in the list.

Sizes are the exact length of :func:`fedcore.wire.message.pack_message` output. The
metrics go into the reply's one MetricRecord — a ``"metrics"`` one is created if the
reply has none; of several, the one named ``"metrics"``, else the first — so a
strategy that wants exactly one MetricRecord per reply (FedAvg) still aggregates it,
averaging these like any other metric. Error replies pass through untouched.
"""

from __future__ import annotations

import time

from fedcore.apps.client_app import CallNext
from fedcore.domain import Context, Message, MetricRecord, RecordDict
from fedcore.wire.message import encoded_size

INCOMING_BYTES = "incoming-message-bytes"
OUTGOING_BYTES = "outgoing-message-bytes"
HANDLER_SECONDS = "handler-seconds"


def message_stats_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Record the message's and the reply's encoded sizes and the handler's time."""
    incoming = encoded_size(msg)
    started = time.perf_counter()
    reply = call_next(msg, context)
    elapsed = time.perf_counter() - started
    if reply.has_error():
        return reply
    stats = {
        INCOMING_BYTES: incoming,
        OUTGOING_BYTES: encoded_size(reply),
        HANDLER_SECONDS: elapsed,
    }
    content = RecordDict(reply.content)
    name = _metrics_name(content)
    content[name] = MetricRecord({**content.metric_records.get(name, {}), **stats})
    return reply.with_content(content)


def _metrics_name(content: RecordDict) -> str:
    """Where the stats go: the only MetricRecord, else ``"metrics"``, else the first."""
    names = list(content.metric_records)
    if len(names) == 1:
        return names[0]
    if "metrics" in names or not names:
        if "metrics" in content and "metrics" not in names:
            raise ValueError("message_stats_mod: the reply's 'metrics' record is no MetricRecord")
        return "metrics"
    return names[0]
