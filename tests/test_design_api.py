"""DESIGN.md §1.2, run as written.

The app below is the design's snippet verbatim, except that its ``...`` line (the
author's training code) is filled in with a toy update that defines ``new`` and
``n``, and ``w0`` is defined. The ``simulate`` call is the design's, run on every
backend (``process``, the design's, ``inline`` and ``ray``).

As written, the snippet's ``main`` passes no ``train_config``, so ``lr`` is missing
from every training message, and its ClientApp has no evaluate handler: every reply
is an error, and the run must still complete, each failure counted, none a hang.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import fedcore as fc
from fedcore.strategy import FedAvg
from fedcore.testing import round_reports
from fedcore.testing.backends import backend_params

w0 = np.zeros(4, dtype=np.float32)

# --- DESIGN.md §1.2 -------------------------------------------------------------------

client = fc.ClientApp()


@client.train()  # also @client.evaluate(), @client.query(), @client.train("name") -> "train.name"
async def train(msg: fc.Message, context: fc.Context) -> fc.Message:  # plain `def` works too
    arrays = msg.content["arrays"]  # ArrayRecord
    lr = msg.content["config"]["lr"]  # ConfigRecord
    new, n = fc.ArrayRecord({"w": arrays["w"] - lr}), 1
    return fc.Message(
        fc.RecordDict({"arrays": new, "metrics": fc.MetricRecord({"num-examples": n})}),
        reply_to=msg,
    )


server = fc.ServerApp()


@server.main()
async def main(
    grid: fc.Grid, context: fc.Context
) -> None:  # plain `def main(grid, context)` works too
    result = await FedAvg(fraction_train=0.1).start(  # noqa: F841 (the design's snippet)
        grid=grid,
        initial_arrays=fc.ArrayRecord({"w": w0}),
        num_rounds=context.run_config["num-server-rounds"],
    )


app = fc.App(server=server, client=client)

# ---------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("backend", backend_params())
async def test_simulate_as_written(backend: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedcore")
    # embedding: inside any running event loop (Jupyter, an async research script)
    result = await fc.simulate(
        app,
        nodes=500,
        backend=backend,
        resources=fc.Resources(num_cpus=1),
        run_config={"num-server-rounds": 3},
        seed=0,
    )
    assert result.value is None
    assert result.context.run_config == {"num-server-rounds": 3}
    reports = round_reports(caplog.records)
    # 50 training replies fail on the missing lr; FedAvg's default fraction_evaluate=1.0
    # then asks all 500 nodes to evaluate, which this ClientApp has no handler for.
    assert [(r.server_round, r.replies, r.failures) for r in reports] == [
        (1, 0, 550),
        (2, 0, 550),
        (3, 0, 550),
    ]
    assert "50× error 2 (CLIENT_APP_RAISED_EXCEPTION): KeyError: 'lr'" in caplog.text
    assert (
        "500× error 2 (CLIENT_APP_RAISED_EXCEPTION): this ClientApp has no handler" in caplog.text
    )


def test_run_simulation_as_written() -> None:
    # scripts: fc.run_simulation(app, nodes=500, ...) blocks
    result = fc.run_simulation(app, nodes=500, run_config={"num-server-rounds": 1}, seed=0)
    assert result.value is None


@pytest.mark.anyio
async def test_the_design_app_learns_when_given_its_learning_rate() -> None:
    """The same ClientApp, driven with the config it reads, updates the model."""
    server = fc.ServerApp()

    @server.main()
    async def with_lr(grid: fc.Grid, context: fc.Context) -> fc.ArrayRecord:
        outcome = await FedAvg(fraction_train=0.1, fraction_evaluate=0.0).start(
            grid=grid,
            initial_arrays=fc.ArrayRecord({"w": w0}),
            num_rounds=2,
            train_config=fc.ConfigRecord({"lr": 0.5}),
        )
        return outcome.arrays

    result = await fc.simulate(fc.App(server=server, client=client), nodes=50, seed=0)
    np.testing.assert_array_equal(result.value["w"], np.full(4, -1.0, np.float32))
