"""Training replies are checked against the message they answer before any strategy
aggregates them: poisoned or mis-shaped replies are refused and counted, the honest
ones averaged, whatever the order the replies come in."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedcore as fc
from fedcore.errors import RefusedReplyError
from fedcore.strategy import FedAvg, FedBuff, FedMedian, Result, Strategy
from fedcore.strategy.replies import MAX_WEIGHT, check_train_reply
from fedcore.strategy.result import RoundReport
from fedcore.testing import round_reports

SENT = fc.RecordDict(
    {
        "arrays": fc.ArrayRecord({"w": np.zeros(3, np.float32), "n": np.zeros((), np.int64)}),
        "config": fc.ConfigRecord({"server-round": 1}),
    }
)


def _content(arrays: dict[str, Any], weight: object = 1) -> fc.RecordDict:
    return fc.RecordDict(
        {
            "arrays": fc.ArrayRecord(arrays),
            "metrics": fc.MetricRecord({"num-examples": weight}),  # type: ignore[dict-item]
        }
    )


def _w(values: Any, dtype: Any = np.float32) -> dict[str, Any]:
    return {"w": np.asarray(values, dtype), "n": np.asarray(7, np.int64)}


def _refusal(content: fc.RecordDict) -> str:
    with pytest.raises(RefusedReplyError) as refused:
        check_train_reply(SENT, content, weighted_by_key="num-examples")
    return refused.value.label


def test_a_reply_laid_out_as_sent_with_finite_values_and_a_count_is_accepted() -> None:
    check_train_reply(SENT, _content(_w([1, 2, 3]), 1e6), weighted_by_key="num-examples")
    check_train_reply(SENT, _content(_w([1, 2, 3]), 0), weighted_by_key="num-examples")
    # The check's float64 sum of these overflows; the values are finite all the same.
    huge = {"w": np.full(3, 1e308), "n": np.asarray(7, np.int64)}
    sent = fc.RecordDict({"arrays": fc.ArrayRecord(dict(huge))})
    check_train_reply(sent, _content(huge))


@pytest.mark.parametrize(
    "arrays",
    [
        _w([1.0, np.nan, 3.0]),
        _w([np.inf, 2.0, 3.0]),
        _w([-np.inf, 2.0, 3.0]),
    ],
)
def test_non_finite_values_are_refused(arrays: dict[str, Any]) -> None:
    assert _refusal(_content(arrays)) == "refused: non-finite"


@pytest.mark.parametrize(
    "values",
    [
        np.asarray([1 + 1j, complex(0, np.nan)], np.complex64),
        np.asarray([1.0, -np.inf], np.float16),
    ],
)
def test_non_finite_values_of_any_float_dtype_are_refused(values: Any) -> None:
    sent = fc.RecordDict({"arrays": fc.ArrayRecord({"z": np.zeros(2, values.dtype)})})
    with pytest.raises(RefusedReplyError, match="'z' holds 1 NaN or infinite"):
        check_train_reply(sent, _content({"z": values}))


@pytest.mark.parametrize(
    "arrays",
    [
        _w([1, 2]),  # a shape unlike the one sent
        _w([1, 2, 3], np.int32),  # a dtype of another kind than the one sent
        {**_w([1, 2, 3]), "extra": np.ones(2, np.float32)},  # an array never sent
        {"w": np.ones(3, np.float32)},  # an array missing
        {"n": np.asarray(7, np.int64), "w": np.ones(3, np.float32)},  # in another order
    ],
)
def test_arrays_unlike_those_sent_are_refused(arrays: dict[str, Any]) -> None:
    assert _refusal(_content(arrays)) == "refused: layout"


@pytest.mark.parametrize(
    "weight", [float("inf"), float("nan"), -1, MAX_WEIGHT * 2, 2**62, [1.0, 2.0], None]
)
def test_a_weight_that_is_no_count_is_refused(weight: object) -> None:
    content = _content(_w([1, 2, 3]), 1 if weight is None else weight)
    if weight is None:
        del content.metric_records["metrics"]["num-examples"]
    assert _refusal(content) == "refused: weight"


def test_another_precision_is_cast_to_the_dtype_sent() -> None:
    reply = _content(_w([1, 2, 3], np.float64) | {"n": np.asarray(7, np.int32)})
    taken = check_train_reply(SENT, reply, weighted_by_key="num-examples")
    arrays = taken.array_records["arrays"]
    assert (arrays["w"].dtype, arrays["n"].dtype) == (np.float32, np.int64)
    assert arrays["w"].tolist() == [1, 2, 3]
    assert taken.metric_records == reply.metric_records
    # A value past float32's range is infinite once cast: refused as such.
    assert _refusal(_content(_w([1e300, 2, 3], np.float64))) == "refused: non-finite"
    unchanged = _content(_w([1, 2, 3]))
    assert check_train_reply(SENT, unchanged) is unchanged


def test_without_arrays_sent_only_the_values_are_checked() -> None:
    nothing_sent = fc.RecordDict({"config": fc.ConfigRecord({"x": 1})})
    check_train_reply(nothing_sent, _content({"anything": np.ones(5)}))
    with pytest.raises(RefusedReplyError, match="holds 5 NaN"):
        check_train_reply(nothing_sent, _content({"anything": np.full(5, np.nan)}))


# The ordering race, through the round driver: three nodes, one hostile, every
# position of the hostile node in the send order (so its reply comes first in one).

ATTACKS: dict[str, tuple[str, Any]] = {
    "nan": ("non-finite", lambda w: (np.full_like(w, np.nan), 1)),
    "inf": ("non-finite", lambda w: (np.full_like(w, np.inf), 1)),
    "inf examples": ("weight", lambda w: (w + 100, float("inf"))),
    "negative examples": ("weight", lambda w: (w + 100, -5)),
    "another shape": ("layout", lambda w: (np.ones(7), 1)),
    "another kind": ("layout", lambda w: (w.astype(np.int64) + 100, 1)),
    "an extra array": ("layout", lambda w: ({"w": w + 100, "x": np.ones(2)}, 1)),
}


def _client(attacker: int, attack: str) -> fc.ClientApp:
    client = fc.ClientApp()

    @client.train()
    def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        partition = int(context.node_config["partition-id"])  # type: ignore[arg-type]
        w = msg.content.array_records["arrays"]["w"]
        if partition == attacker:
            arrays, weight = ATTACKS[attack][1](w)
        else:
            arrays, weight = w + partition, partition  # honest: weighted by partition
        if not isinstance(arrays, dict):
            arrays = {"w": arrays}
        metrics = fc.MetricRecord({"num-examples": weight})
        content = fc.RecordDict({"arrays": fc.ArrayRecord(arrays), "metrics": metrics})
        return fc.Message(content, reply_to=msg)

    return client


def _app(client: fc.ClientApp, strategy: Strategy) -> fc.App:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> Result:
        w0 = fc.ArrayRecord({"w": np.zeros(3)})
        result: Result = await strategy.start(grid=grid, initial_arrays=w0, num_rounds=1)
        return result

    return fc.App(server=server, client=client)


async def _run(
    attacker: int, attack: str, strategy: Strategy, caplog: pytest.LogCaptureFixture
) -> tuple[Result, RoundReport]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedcore"):
        app = _app(_client(attacker, attack), strategy)
        result: Result = (await fc.simulate(app, nodes=4, seed=0, backend="inline")).value
    (report,) = round_reports(caplog.records)
    return result, report


@pytest.mark.anyio
@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_fedavg_refuses_and_counts_the_hostile_reply_wherever_it_comes(
    attack: str, caplog: pytest.LogCaptureFixture
) -> None:
    label = f"refused: {ATTACKS[attack][0]}"
    for attacker in (1, 2, 3):  # partition 0 sends nothing usable: it weighs 0 examples
        result, report = await _run(attacker, attack, FedAvg(fraction_evaluate=0.0), caplog)
        honest = [p for p in (0, 1, 2, 3) if p != attacker]
        expected = sum(p * p for p in honest) / sum(honest)  # w0 + p, weighted by p
        np.testing.assert_allclose(result.arrays["w"], np.full(3, expected))
        assert result.arrays["w"].dtype == np.float64
        assert report.train_replies == 3
        assert report.train_failures == {label: 1}
        assert f"not aggregated ({label})" in caplog.text


@pytest.mark.anyio
async def test_robust_and_asynchronous_strategies_refuse_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    result, report = await _run(2, "nan", FedMedian(fraction_evaluate=0.0), caplog)
    np.testing.assert_allclose(result.arrays["w"], np.ones(3))  # the median of 0, 1, 3
    assert report.train_failures == {"refused: non-finite": 1}

    # The hostile node's one reply comes long before the honest nodes' tenth: refused,
    # it is benched for the rest of the step, which the honest replies fill.
    buffered = FedBuff(buffer_size=10, concurrency=4)
    result, report = await _run(2, "inf examples", buffered, caplog)
    assert np.isfinite(result.arrays["w"]).all()
    assert report.train_failures == {"refused: weight": 1}
    assert report.train_replies == 10


@pytest.mark.anyio
async def test_validate_replies_false_keeps_flowers_permissive_averaging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = FedAvg(fraction_evaluate=0.0, validate_replies=False)
    result, report = await _run(1, "nan", strategy, caplog)
    assert np.isnan(result.arrays["w"]).all()
    assert report.train_failures == {}
    assert report.train_replies == 4


def test_validate_replies_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="validate_replies must be a bool"):
        FedAvg(validate_replies="false")  # type: ignore[arg-type]


def test_a_simulated_run_with_a_nan_node_keeps_a_finite_model_and_reports_it() -> None:
    app = Path(__file__).resolve().parent / "poisoned_app"
    fedcore = Path(sys.executable).parent / "fedcore"
    done = subprocess.run(
        [str(fedcore), "simulate", str(app), "-n", "3", "--backend", "inline", "--seed", "0"],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert "final model: [5.0, 5.0, 5.0]" in done.stdout
    assert "2 failures (refused: non-finite ×2)" in done.stdout.splitlines()[-1]
    assert "not aggregated (refused: non-finite): array 'w' holds 3 NaN" in done.stderr
    [results] = [line for line in done.stderr.splitlines() if line.startswith("results: ")]
    metrics = Path(results.removeprefix("results: ")) / "metrics.jsonl"
    rounds = [row for row in map(json.loads, metrics.read_text().splitlines()) if "round" in row]
    assert [row["failures_by_label"] for row in rounds] == [{"refused: non-finite": 1}] * 2
