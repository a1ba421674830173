"""FedProx: FedAvg's aggregation, plus ``proximal-mu`` in every training config."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedcore import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from fedcore.strategy import FedAvg
from fedcore.strategy.fedprox import FedProx

ARRAYS = ArrayRecord({"w": np.array([1.0, 2.0])})


def test_training_config_carries_mu_without_touching_the_callers() -> None:
    config = ConfigRecord({"lr": 0.01})
    messages = FedProx(proximal_mu=0.5).configure_train(3, ARRAYS, config, [4, 5, 6])
    assert len(messages) == 3
    for message in messages:
        sent = message.content["config"]
        assert sent == ConfigRecord({"lr": 0.01, "proximal-mu": 0.5, "server-round": 3})
        assert message.content["arrays"] is ARRAYS
    assert config == ConfigRecord({"lr": 0.01})


def test_evaluation_config_has_no_mu() -> None:
    strategy = FedProx(proximal_mu=0.5, fraction_evaluate=0.5, min_evaluate_nodes=1)
    (message,) = strategy.configure_evaluate(1, ARRAYS, ConfigRecord(), [1, 2])
    assert "proximal-mu" not in message.content["config"]


def _round(strategy: FedAvg, errors: bool) -> ArrayRecord | None:
    messages = strategy.configure_train(1, ARRAYS, ConfigRecord(), [1, 2, 3])
    aggregation = strategy.train_aggregation(1)
    assert aggregation is not None
    updates = (
        [([0.0, 4.0], 1), None, ([4.0, 0.0], 3)] if errors else [([0.0, 4.0], 1), ([4.0, 0.0], 3)]
    )
    for index, (sent, update) in enumerate(zip(messages, updates, strict=False)):
        sent.metadata.message_id = str(index)
        if update is None:
            aggregation.add(Message(error=Error(2, "boom"), reply_to=sent))
            continue
        w, n = update
        content = RecordDict(
            {
                "arrays": ArrayRecord({"w": np.array(w)}),
                "metrics": MetricRecord({"num-examples": n}),
            }
        )
        aggregation.add(Message(content, reply_to=sent))
    return aggregation.result()[0]


def test_aggregation_is_fedavgs_and_ignores_errors() -> None:
    arrays = _round(FedProx(proximal_mu=1.0), errors=False)
    assert arrays is not None
    np.testing.assert_array_equal(arrays["w"], [3.0, 1.0])  # (0 + 12) / 4, (4 + 0) / 4
    assert arrays == _round(FedProx(proximal_mu=1.0), errors=True)
    assert arrays == _round(FedAvg(), errors=False)


def test_zero_mu_warns_that_it_is_fedavg(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert FedProx().proximal_mu == 0.0
    assert "proximal_mu=0" in caplog.text


def test_positional_arguments_follow_flower() -> None:
    strategy = FedProx(0.5, 0.5, 3, 3, 3, "n", "a", "c", None, None, 0.25)
    assert strategy.proximal_mu == 0.25


@pytest.mark.parametrize(
    ("mu", "error"), [(-0.1, ValueError), ("0.1", TypeError), (float("nan"), ValueError)]
)
def test_bad_mu(mu: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="proximal_mu"):
        FedProx(proximal_mu=mu)  # type: ignore[arg-type]
