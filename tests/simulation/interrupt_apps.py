"""Apps for the interrupt tests; workers import them from here by name.

``model``: FedAvg over a model of a few megabytes, so that every round puts
segments in shared memory, for many more rounds than a test waits for (unless
the run config's ``num-server-rounds`` says otherwise).
``stuck``: a plain ``def`` ClientApp that says "stuck" and never returns, for the
inline backend. ``clinging``: ``model`` whose ServerApp, once stopped, never lets go.
"""

from __future__ import annotations

import threading
import time

import anyio
import numpy as np

import fedcore as fc
from fedcore.strategy import FedAvg

MODEL_FLOATS = 1 << 20
"""4 MB of float32: well over the size that goes through shared memory."""

client = fc.ClientApp()


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    time.sleep(0.05)  # a round lasts long enough to be interrupted in its midst
    content = fc.RecordDict(
        {
            "arrays": fc.ArrayRecord({"w": msg.content["arrays"]["w"] + 1.0}),
            "metrics": fc.MetricRecord({"num-examples": 1}),
        }
    )
    return fc.Message(content, reply_to=msg)


server = fc.ServerApp()


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0)
    initial = fc.ArrayRecord({"w": np.zeros(MODEL_FLOATS, dtype=np.float32)})
    rounds = context.run_config.get("num-server-rounds", 100_000)
    assert isinstance(rounds, int)
    await strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds)


model = fc.App(server=server, client=client)


stuck_client = fc.ClientApp()


@stuck_client.train()
def never_return(msg: fc.Message, context: fc.Context) -> fc.Message:
    print("stuck", flush=True)
    threading.Event().wait()  # a plain handler stuck for good, in its worker thread
    raise AssertionError("unreachable")


stuck = fc.App(server=server, client=stuck_client)


clinging_server = fc.ServerApp()


@clinging_server.main()
async def main_that_clings(grid: fc.Grid, context: fc.Context) -> None:
    try:
        await main(grid, context)
    finally:  # an author's cleanup that waits for something that never comes
        with anyio.CancelScope(shield=True):
            await anyio.sleep_forever()


clinging = fc.App(server=clinging_server, client=client)
