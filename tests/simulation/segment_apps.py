"""A ClientApp for the adopted-segment tests; workers import it from here by name."""

from __future__ import annotations

import fedcore as fc

client = fc.ClientApp()


@client.train()
def total(msg: fc.Message, context: fc.Context) -> fc.Message:
    """Reply with the sum of the arrays it got: small, so no outcome segment is written."""
    weights = msg.content["arrays"]["w"]
    metrics = fc.MetricRecord({"total": float(weights.sum()), "size": int(weights.size)})
    return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)
