"""The ServerApp: the strategy named by the run config, evaluated on the server's test set.

``fedcore simulate examples/strategy-comparison --run-config "strategy='fedadam'"``
picks one; ``compare.py`` runs several on the same split and times them.
"""

from __future__ import annotations

import fedcore as fc
from fedcore import strategy as st
from strategy_comparison import task

server = fc.ServerApp()

STRATEGIES = (
    "fedavg",
    "fedprox",
    "fedavgm",
    "fedadam",
    "fedyogi",
    "fedadagrad",
    "qfedavg",
    "fedmedian",
    "fedtrimmedavg",
    "krum",
    "multikrum",
    "bulyan",
    "dp-server",
    "dp-server-adaptive",
    "fedbuff",
)


def build(name: str, per_round: int, online: int, config: fc.ConfigRecord) -> st.Strategy:
    """The strategy ``name``, sampling ``per_round`` of the ``online`` nodes each round."""
    sampling = {
        "fraction_train": per_round / online,
        "fraction_evaluate": 0.0,
        "min_train_nodes": per_round,
        "min_available_nodes": per_round,
    }
    suspects = {"num_malicious_nodes": 1}  # how many hostile nodes the robust rules resist
    match name:
        case "fedavg":
            return st.FedAvg(**sampling)
        case "fedprox":
            return st.FedProx(proximal_mu=0.1, **sampling)
        case "fedavgm":
            return st.FedAvgM(server_momentum=0.5, **sampling)
        case "fedadam":
            return st.FedAdam(eta=0.05, **sampling)
        case "fedyogi":
            return st.FedYogi(eta=0.05, **sampling)
        case "fedadagrad":
            return st.FedAdagrad(eta=0.05, **sampling)
        case "qfedavg":
            return st.QFedAvg(config["learning-rate"], q=0.1, **sampling)
        case "fedmedian":
            return st.FedMedian(**sampling)
        case "fedtrimmedavg":
            return st.FedTrimmedAvg(beta=0.2, **sampling)
        case "krum":
            return st.Krum(**sampling, **suspects)
        case "multikrum":
            return st.MultiKrum(num_nodes_to_select=per_round // 2, **sampling, **suspects)
        case "bulyan":
            return st.Bulyan(**sampling, **suspects)
        case "dp-server":
            return st.DifferentialPrivacyServerSideFixedClipping(
                st.FedAvg(**sampling),
                noise_multiplier=0.01,
                clipping_norm=5.0,
                num_sampled_clients=per_round,
            )
        case "dp-server-adaptive":
            return st.DifferentialPrivacyServerSideAdaptiveClipping(
                st.FedAvg(**sampling),
                noise_multiplier=0.01,
                num_sampled_clients=per_round,
                initial_clipping_norm=5.0,
            )
        case "fedbuff":
            return st.FedBuff(
                buffer_size=per_round, concurrency=per_round, min_available_nodes=per_round
            )
    raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")


def evaluate_on_server(server_round: int, arrays: fc.ArrayRecord) -> fc.MetricRecord:
    _, _, x_test, y_test = task.dataset()
    loss, accuracy = task.evaluate(dict(arrays), x_test, y_test)
    return fc.MetricRecord({"accuracy": accuracy, "loss": loss})


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> fc.ArrayRecord:
    config = context.run_config
    per_round = config["nodes-per-round"]
    online = len(await grid.wait_for_nodes(per_round, timeout=60))
    strategy = build(config["strategy"], per_round, online, config)
    result = await strategy.start(
        grid=grid,
        initial_arrays=fc.ArrayRecord(task.initial_model()),
        num_rounds=config["num-server-rounds"],
        train_config=fc.ConfigRecord({"lr": config["learning-rate"]}),
        evaluate_fn=evaluate_on_server,
    )
    return result.arrays
