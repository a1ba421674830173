"""``adaptiveclipping_mod`` and ``LocalDpMod`` on a ClientApp, against numbers by hand.

Sent w = (1, 1), b = (0); the handler answers w = (4, 5), b = (12): an update of
(3, 4, 12), norm 13. Clipped to 6.5 it is halved: w = (2.5, 3), b = (6).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

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
from fedcore.mods import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod

pytestmark = pytest.mark.anyio

NODE_ID = 7
CONTEXT = Context(run_id=3, node_id=NODE_ID, node_config={})


def _message(
    clipping_norm: float | None = 6.5, message_type: str = "train", **extra: Any
) -> Message:
    config = ConfigRecord({} if clipping_norm is None else {"clipping_norm": clipping_norm})
    arrays = ArrayRecord({"w": np.array([1.0, 1.0]), "b": np.array([0.0])})
    message = Message(
        RecordDict({"arrays": arrays, "config": config, **extra}), NODE_ID, message_type
    )
    message.metadata.message_id = "m1"
    message.metadata.run_id = 3
    message.metadata.src_node_id = 1
    return message


def _moving_to(
    w: list[float], b: list[float], metric_records: int = 1
) -> Callable[[Message, Context], Message]:
    def body(msg: Message, context: Context) -> Message:
        content = RecordDict({"arrays": ArrayRecord({"w": np.array(w), "b": np.array(b)})})
        for index in range(metric_records):
            content[f"metrics{index or ''}"] = MetricRecord({"num-examples": 4})
        return Message(content, reply_to=msg)

    return body


async def _run(mod: Any, body: Callable[[Message, Context], Message], msg: Message) -> Message:
    client = ClientApp(mods=[mod])
    client.train()(body)
    client.evaluate()(body)
    return await client.handle(msg, CONTEXT, in_thread=True)


# ------------------------------------------------------------------ adaptiveclipping_mod


async def test_adaptiveclipping_mod_clips_a_long_update_and_says_so() -> None:
    reply = await _run(adaptiveclipping_mod, _moving_to([4.0, 5.0], [12.0]), _message(6.5))

    np.testing.assert_allclose(reply.content["arrays"]["w"], [2.5, 3.0])
    np.testing.assert_allclose(reply.content["arrays"]["b"], [6.0])
    assert reply.content["metrics"] == MetricRecord({"num-examples": 4, "norm_bit": 1})


async def test_adaptiveclipping_mod_leaves_a_short_update_and_says_so() -> None:
    reply = await _run(adaptiveclipping_mod, _moving_to([4.0, 5.0], [12.0]), _message(13.0))

    np.testing.assert_allclose(reply.content["arrays"]["w"], [4.0, 5.0])
    assert reply.content["metrics"] == MetricRecord({"num-examples": 4, "norm_bit": 0})


@pytest.mark.parametrize("records", [0, 2])
async def test_adaptiveclipping_mod_needs_one_metric_record_for_the_bit(records: int) -> None:
    body = _moving_to([4.0, 5.0], [12.0], metric_records=records)

    reply = await _run(adaptiveclipping_mod, body, _message(6.5))

    assert reply.has_error()
    assert f"must carry one MetricRecord for 'norm_bit', found {records}" in reply.error.reason


async def test_adaptiveclipping_mod_without_the_norm_names_its_strategy() -> None:
    reply = await _run(adaptiveclipping_mod, _moving_to([1.0, 1.0], [0.0]), _message(None))

    assert reply.has_error()
    assert "adaptiveclipping_mod: the train message has no 'clipping_norm'" in reply.error.reason
    assert "DifferentialPrivacyClientSideAdaptiveClipping" in reply.error.reason


async def test_adaptiveclipping_mod_passes_evaluation_and_error_replies() -> None:
    evaluated = await _run(
        adaptiveclipping_mod, _moving_to([9.0, 9.0], [9.0]), _message(None, "evaluate")
    )
    failed = await _run(
        adaptiveclipping_mod,
        lambda msg, context: Message(error=Error(0, "no data"), reply_to=msg),
        _message(1.0),
    )

    np.testing.assert_allclose(evaluated.content["arrays"]["w"], [9.0, 9.0])
    assert "norm_bit" not in evaluated.content["metrics"]
    assert failed.error == Error(0, "no data")


# ------------------------------------------------------------------ LocalDpMod


def _gaussian_std(sensitivity: float, epsilon: float, delta: float) -> float:
    """The Gaussian mechanism's σ (Dwork and Roth, theorem A.1)."""
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


async def test_local_dp_clips_then_adds_the_gaussian_mechanisms_noise() -> None:
    mod = LocalDpMod(clipping_norm=6.5, sensitivity=2.0, epsilon=0.5, delta=1e-5, seed=4)
    std = _gaussian_std(2.0, 0.5, 1e-5)
    assert mod.std == pytest.approx(std)
    draws = np.random.default_rng(4)

    for _ in range(2):  # each reply gets fresh noise, drawn in the record's key order
        reply = await _run(mod, _moving_to([4.0, 5.0], [12.0]), _message(None))
        arrays = reply.content["arrays"]
        np.testing.assert_allclose(arrays["w"], np.array([2.5, 3.0]) + draws.normal(0.0, std, 2))
        np.testing.assert_allclose(arrays["b"], np.array([6.0]) + draws.normal(0.0, std, 1))
        assert reply.content["metrics"] == MetricRecord({"num-examples": 4})


async def test_local_dp_noises_a_short_update_too() -> None:
    mod = LocalDpMod(clipping_norm=100.0, sensitivity=1.0, epsilon=1.0, delta=0.01, seed=0)
    draws = np.random.default_rng(0)
    std = _gaussian_std(1.0, 1.0, 0.01)

    reply = await _run(mod, _moving_to([4.0, 5.0], [12.0]), _message(None))

    np.testing.assert_allclose(
        reply.content["arrays"]["w"], np.array([4.0, 5.0]) + draws.normal(0.0, std, 2)
    )


async def test_local_dp_passes_other_messages_and_needs_one_array_record() -> None:
    mod = LocalDpMod(clipping_norm=1.0, sensitivity=1.0, epsilon=1.0, delta=1e-5)

    evaluated = await _run(mod, _moving_to([9.0, 9.0], [9.0]), _message(None, "evaluate"))
    extra = await _run(mod, _moving_to([1.0, 1.0], [0.0]), _message(None, extra=ArrayRecord()))

    np.testing.assert_allclose(evaluated.content["arrays"]["w"], [9.0, 9.0])
    assert extra.has_error()
    assert "LocalDpMod: a train message must carry one ArrayRecord, found 2" in extra.error.reason


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"clipping_norm": 0.0}, "clipping_norm must be > 0"),
        ({"sensitivity": -1.0}, "sensitivity must be >= 0"),
        ({"epsilon": 0.0}, "epsilon must be > 0"),
        ({"delta": 0.0}, "delta must be > 0"),
        ({"delta": 1.0}, "delta must be below 1"),
        ({"epsilon": "1"}, "epsilon must be a finite number"),
    ],
)
def test_local_dp_bad_arguments(arguments: dict[str, Any], error: str) -> None:
    options = {"clipping_norm": 1.0, "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5}
    with pytest.raises(ValueError, match=error):
        LocalDpMod(**{**options, **arguments})


# ------------------------------------------------------------------ 0-d arrays


def _scalar_message(clipping_norm: float | None) -> Message:
    content = RecordDict({"arrays": ArrayRecord({"w": np.array(0.0)})})
    if clipping_norm is not None:
        content["config"] = ConfigRecord({"clipping_norm": clipping_norm})
    return Message(content, NODE_ID, "train")


def _scalar_reply(msg: Message, context: Context) -> Message:
    content = RecordDict(
        {"arrays": ArrayRecord({"w": np.array(2.0)}), "metrics": MetricRecord({"loss": 0.5})}
    )
    return Message(content, reply_to=msg)


@pytest.mark.parametrize(
    "mod",
    [
        fixedclipping_mod,
        adaptiveclipping_mod,
        LocalDpMod(clipping_norm=1.0, sensitivity=0.0, epsilon=1.0, delta=0.1),
    ],
    ids=["fixed", "adaptive", "local"],
)
def test_a_0d_update_is_clipped_and_stays_a_0d_array(mod: Any) -> None:
    """Sent 0, replied 2: an update of norm 2, clipped to 1. (Flower's mods let a 0-d
    update through unclipped: its in-place scaling of a numpy scalar does nothing.)"""
    local = isinstance(mod, LocalDpMod)
    reply = mod(_scalar_message(None if local else 1.0), CONTEXT, _scalar_reply)
    out = reply.content.array_records["arrays"]["w"].numpy()
    assert isinstance(out, np.ndarray)
    assert out.shape == ()
    np.testing.assert_array_equal(out, np.array(1.0))
    if mod is adaptiveclipping_mod:
        assert reply.content.metric_records["metrics"]["norm_bit"] == 1
