"""``message_size_mod`` and ``arrays_size_mod`` log sizes and change nothing."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedcore.apps.client_app import ClientApp
from fedcore.domain import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from fedcore.mods import arrays_size_mod, message_size_mod
from fedcore.wire import pack_message

pytestmark = pytest.mark.anyio

CONTEXT = Context(run_id=3, node_id=7, node_config={})


def _message() -> Message:
    arrays = ArrayRecord({"w": np.zeros(5), "b": np.zeros(3, dtype=np.float32)})
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({"lr": 0.1})})
    message = Message(content, 7, "train")
    message.metadata.message_id = "m1"
    return message


def _train(msg: Message, context: Context) -> Message:
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": np.ones(5)}),
            "extra": ArrayRecord({"mask": np.ones((2, 3), dtype=np.int8)}),
            "metrics": MetricRecord({"num-examples": 4}),
        }
    )
    return Message(content, reply_to=msg)


async def _run(
    mod: object, body: object, caplog: pytest.LogCaptureFixture
) -> tuple[Message, list[str]]:
    client = ClientApp(mods=[mod])
    client.train()(body)
    with caplog.at_level(logging.INFO, logger="fedcore.mods.sizes"):
        reply = await client.handle(_message(), CONTEXT, in_thread=True)
    return reply, [r.getMessage() for r in caplog.records if r.name == "fedcore.mods.sizes"]


async def test_message_size_mod_logs_the_encoded_sizes(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Message] = []

    def body(msg: Message, context: Context) -> Message:
        reply = _train(msg, context)
        seen.append(reply)
        return reply

    reply, lines = await _run(message_size_mod, body, caplog)

    incoming = len(pack_message(_message()))
    outgoing = len(pack_message(seen[0]))
    assert lines == [
        f"message_size_mod: incoming train message: {incoming} bytes",
        f"message_size_mod: outgoing reply: {outgoing} bytes",
    ]
    assert reply is seen[0]


async def test_arrays_size_mod_logs_elements_and_bytes_per_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reply, lines = await _run(arrays_size_mod, _train, caplog)

    assert lines == [
        # 5 float64 + 3 float32 = 8 elements, 40 + 12 bytes
        "arrays_size_mod: incoming ArrayRecord 'arrays': 8 elements, 52 bytes",
        "arrays_size_mod: incoming arrays in all: 8 elements, 52 bytes",
        "arrays_size_mod: outgoing ArrayRecord 'arrays': 5 elements, 40 bytes",
        "arrays_size_mod: outgoing ArrayRecord 'extra': 6 elements, 6 bytes",
        "arrays_size_mod: outgoing arrays in all: 11 elements, 46 bytes",
    ]
    assert reply.content["metrics"] == MetricRecord({"num-examples": 4})


async def test_arrays_size_mod_counts_an_error_reply_as_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def failing(msg: Message, context: Context) -> Message:
        return Message(error=Error(0, "no data"), reply_to=msg)

    reply, lines = await _run(arrays_size_mod, failing, caplog)

    assert reply.error == Error(0, "no data")
    assert lines[-1] == "arrays_size_mod: outgoing arrays in all: 0 elements, 0 bytes"
