"""FedAvg over three nodes, one of them hostile: partition 0 answers every training
message with NaN arrays. The honest nodes add ``partition + 1`` to the model, so one
round moves it by 2.5; the ServerApp prints the model it ends with."""

from __future__ import annotations

import numpy as np

from fedcore import (
    ArrayRecord,
    ClientApp,
    Context,
    Grid,
    Message,
    MetricRecord,
    RecordDict,
    ServerApp,
)
from fedcore.strategy import FedAvg

client = ClientApp()
server = ServerApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    partition = int(context.node_config["partition-id"])
    w = msg.content.array_records["arrays"]["w"]
    w = np.full_like(w, np.nan) if partition == 0 else w + partition + 1
    content = RecordDict(
        {"arrays": ArrayRecord({"w": w}), "metrics": MetricRecord({"num-examples": 1})}
    )
    return Message(content, reply_to=msg)


@server.main()
async def main(grid: Grid, context: Context) -> None:
    result = await FedAvg(fraction_evaluate=0.0, min_available_nodes=3).start(
        grid=grid,
        initial_arrays=ArrayRecord({"w": np.zeros(3)}),
        num_rounds=int(context.run_config["num-server-rounds"]),  # type: ignore[arg-type]
    )
    print(f"final model: {result.arrays['w'].tolist()}", flush=True)
