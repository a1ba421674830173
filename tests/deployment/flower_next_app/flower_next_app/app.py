"""Flower 1.43's additions, in one ServerApp that prints a JSON line for each:

- ``grid.pull_messages()`` without ids takes every reply that arrived (polled the way a
  Flower loop polls, with a deadline), each once; ``message_ids=`` still pulls, with a
  DeprecationWarning;
- ``start(..., should_stop=...)`` ends the run after round ``stop-after``;
- ``start(..., num_rounds=0)`` returns the initial arrays.

Simulation and deployment must print the same lines.
"""

from __future__ import annotations

import json
import warnings

import numpy as np

import fedcore as fc
from fedcore.strategy import FedAvg, Result

server = fc.ServerApp()
client = fc.ClientApp()

PULL_DEADLINE = 60.0
"""Seconds the ServerApp polls for its replies before it gives up."""


@client.query()
def query(msg: fc.Message, context: fc.Context) -> fc.Message:
    probe = msg.content["config"]["probe"]
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord({"probe": probe})}), reply_to=msg)


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    w = np.asarray(msg.content["arrays"]["w"]) + 1.0
    metrics = fc.MetricRecord({"num-examples": 1})
    return fc.Message(
        fc.RecordDict({"arrays": fc.ArrayRecord({"w": w}), "metrics": metrics}), reply_to=msg
    )


@client.evaluate()
def evaluate(msg: fc.Message, context: fc.Context) -> fc.Message:
    metrics = fc.MetricRecord({"num-examples": 1, "loss": 0.5})
    return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)


def say(**line: object) -> None:
    print(json.dumps(line), flush=True)


async def pull_any(grid: fc.Grid, node_ids: list[int]) -> None:
    messages = [
        fc.Message(fc.RecordDict({"config": fc.ConfigRecord({"probe": i})}), node, "query")
        for i, node in enumerate(node_ids)
    ]
    ids = await grid.push_messages(messages)
    replies: list[fc.Message] = []
    give_up = grid.clock.now() + PULL_DEADLINE
    while len(replies) < len(ids):
        replies += await grid.pull_messages()
        if len(replies) < len(ids):
            assert grid.clock.now() < give_up, f"{len(replies)} of {len(ids)} replies came"
            await grid.clock.sleep(0.02)
    answered = sorted(reply.metadata.reply_to_message_id for reply in replies)
    probes = sorted(int(reply.content["metrics"]["probe"]) for reply in replies)  # type: ignore[arg-type]
    say(pulled_any=answered == sorted(ids), probes=probes, again=len(await grid.pull_messages()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        named = await grid.pull_messages(message_ids=ids[:1])
    say(deprecated=[w.category.__name__ for w in caught], named=len(named))


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> Result:
    config = context.run_config
    node_ids = sorted(await grid.wait_for_nodes(int(config["min-nodes"]), timeout=60))  # type: ignore[arg-type]
    await pull_any(grid, node_ids)
    w0 = fc.ArrayRecord({"w": np.zeros(2)})

    def should_stop(server_round: int, result: Result) -> bool:
        return server_round == config["stop-after"]

    result = await FedAvg(fraction_evaluate=0.5).start(
        grid,
        w0,
        num_rounds=int(config["num-server-rounds"]),  # type: ignore[arg-type]
        should_stop=should_stop,
    )
    say(rounds=sorted(result.train_metrics_clientapp), w=result.arrays["w"].tolist())
    zero = await FedAvg().start(grid, w0, num_rounds=0)
    say(zero_rounds_arrays_are_initial=zero.arrays == w0, metrics=len(zero.train_metrics_clientapp))
    return result
