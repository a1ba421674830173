"""The legacy ServerApp: server_fn returns a FedAvg and a ServerConfig."""

from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg


def server_fn(context: Context) -> ServerAppComponents:
    min_clients = int(context.run_config["min-clients"])
    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=1.0,
        min_fit_clients=min_clients,
        min_evaluate_clients=min_clients,
        min_available_clients=min_clients,
    )
    config = ServerConfig(num_rounds=int(context.run_config["num-server-rounds"]))
    return ServerAppComponents(strategy=strategy, config=config)


app = ServerApp(server_fn=server_fn)
