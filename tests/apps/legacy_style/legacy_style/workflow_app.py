"""The same strategy driven from a Message-API main: LegacyContext and DefaultWorkflow."""

import json

from flwr.common import Context
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    min_clients = int(context.run_config["min-clients"])
    strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=1.0, min_available_clients=min_clients)
    context = LegacyContext(
        context=context,
        config=ServerConfig(num_rounds=int(context.run_config["num-server-rounds"])),
        strategy=strategy,
    )
    workflow = DefaultWorkflow()
    workflow(grid, context)
    print(json.dumps({"losses_distributed": context.history.losses_distributed}))
