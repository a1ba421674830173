"""A ClientApp written against Flower's names (Array, MessageType, a lifespan taking a
Context); workers import it from here by name."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np

import fedcore as fc

client = fc.ClientApp()
INSIDE = threading.local()
"""The node whose lifespan is open on this thread (handlers run concurrently inline)."""


@client.lifespan()
def lifespan(context: fc.Context) -> Iterator[None]:
    INSIDE.node = context.node_id
    yield
    INSIDE.node = -1


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    arrays = msg.content["arrays"]
    item = arrays["w"]
    assert isinstance(item, fc.Array)
    assert item.stype == "numpy.ndarray"
    plain = item.numpy()
    assert type(plain) is np.ndarray
    assert np.shares_memory(plain, item)
    doubled = fc.Array(plain * 2)
    config = fc.ConfigRecord(
        {
            "delivered-at": msg.metadata.delivered_at,
            "lifespan-node": getattr(INSIDE, "node", -1),
            "node": context.node_id,
        }
    )
    reply = fc.RecordDict(
        {
            "arrays": fc.ArrayRecord.from_array_dict({"w": doubled, "same": item}),
            "config": config,
        }
    )
    return fc.Message(reply, reply_to=msg)
