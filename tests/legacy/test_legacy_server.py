"""The legacy server in one process: History, Server, GridClientProxy, ServerApp, DefaultWorkflow.

The nodes are a stand-in for the blocking grid a plain ``def main`` gets: it hands each
message to a legacy ``ClientApp(client_fn=...)`` (a NumPyClient whose fit adds 1 to the
model and whose loss is the model's sum) and returns its replies, so the Messages the
legacy server sends are checked for what a real node receives.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from fedcore import Context, Error, Message, RecordDict
from fedcore.errors import ErrorReplyError
from fedcore.legacy import conversion
from fedcore.legacy.client_app import ClientApp
from fedcore.legacy.client_manager import SimpleClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.grid_client_proxy import GridClientProxy
from fedcore.legacy.history import History
from fedcore.legacy.numpy_client import NumPyClient
from fedcore.legacy.server import Server, fit_clients
from fedcore.legacy.server_app import ServerApp
from fedcore.legacy.server_config import ServerAppComponents, ServerConfig
from fedcore.legacy.strategy import FedAvg
from fedcore.legacy.types import (
    Code,
    FitIns,
    GetParametersIns,
    Parameters,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from fedcore.legacy.workflow import DefaultWorkflow, LegacyContext


class AddOne(NumPyClient):
    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        return [np.zeros(3)]

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> Any:
        return [parameters[0] + 1.0], 10, {"seen": config.get("lr", -1.0)}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> Any:
        return float(parameters[0].sum()), 5, {}


CLIENT = ClientApp(client_fn=lambda context: AddOne().to_client())


@dataclass
class Nodes:
    """Nodes behind a blocking grid: each answers with :data:`CLIENT`; ``silent`` ones
    never answer, ``failing`` ones answer with an error."""

    node_ids: list[int]
    silent: set[int] = field(default_factory=set)
    failing: set[int] = field(default_factory=set)
    sent: list[Message] = field(default_factory=list)
    timeouts: list[float | None] = field(default_factory=list)
    run: Any = field(default_factory=lambda: SimpleNamespace(run_id=7))

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        replies = []
        for message in messages:
            message.metadata.message_id = f"message-{len(self.sent)}"
            self.sent.append(message)
            self.timeouts.append(timeout)
            node_id = message.metadata.dst_node_id
            if node_id in self.silent:
                continue
            if node_id in self.failing:
                replies.append(Message(Error(2, "the ClientApp raised"), reply_to=message))
                continue
            replies.append(CLIENT(message, Context(run_id=7, node_id=node_id)))
        return replies


def fedavg(clients: int) -> FedAvg:
    return FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=1.0,
        min_fit_clients=clients,
        min_evaluate_clients=clients,
        min_available_clients=clients,
    )


def registered(nodes: Nodes) -> SimpleClientManager:
    manager = SimpleClientManager()
    for node_id in nodes.node_ids:
        manager.register(GridClientProxy(node_id=node_id, grid=nodes, run_id=7))
    return manager


def test_history_fills_and_reads_as_flowers() -> None:
    history = History()
    history.add_loss_distributed(1, 3.0)
    history.add_loss_distributed(2, 6.0)
    history.add_loss_centralized(0, 1.5)
    history.add_metrics_distributed_fit(1, {"acc": 0.5})
    history.add_metrics_distributed(1, {"acc": 0.25})
    history.add_metrics_centralized(0, {"acc": 0.75})

    assert history.losses_distributed == [(1, 3.0), (2, 6.0)]
    assert history.metrics_distributed_fit == {"acc": [(1, 0.5)]}
    assert repr(history) == (
        "History (loss, distributed):\n\tround 1: 3.0\n\tround 2: 6.0\n"
        "History (loss, centralized):\n\tround 0: 1.5\n"
        "History (metrics, distributed, fit):\n{'acc': [(1, 0.5)]}\n"
        "History (metrics, distributed, evaluate):\n{'acc': [(1, 0.25)]}\n"
        "History (metrics, centralized):\n{'acc': [(0, 0.75)]}"
    )
    assert repr(History()) == ""


def test_server_config_defaults_and_repr() -> None:
    assert repr(ServerConfig()) == "num_rounds=1, no round_timeout"
    assert repr(ServerConfig(3, 2.5)) == "num_rounds=3, round_timeout=2.5s"
    assert ServerAppComponents() == ServerAppComponents(None, None, None, None)


def test_server_runs_fedavg_rounds_over_grid_proxies_and_fills_the_history() -> None:
    nodes = Nodes([11, 12, 13])
    server = Server(client_manager=registered(nodes), strategy=fedavg(3))

    history, elapsed = server.fit(num_rounds=2, timeout=30.0)

    assert history.losses_distributed == [(1, 3.0), (2, 6.0)]
    assert history.metrics_distributed_fit == {}  # FedAvg has no fit_metrics_aggregation_fn
    assert elapsed >= 0
    [model] = parameters_to_ndarrays(server.parameters)
    assert model.tolist() == [2.0, 2.0, 2.0]
    # The initial model came from one client; then a train and an evaluate per node a round.
    types = [message.metadata.message_type for message in nodes.sent]
    assert types == ["get_parameters"] + (["train"] * 3 + ["evaluate"] * 3) * 2
    first_train = nodes.sent[1]
    assert set(first_train.content.keys()) == {"fitins.parameters", "fitins.config"}
    assert first_train.metadata.group_id == "1"
    assert first_train.metadata.ttl == 30.0  # the round timeout is each message's TTL


def test_the_default_strategy_is_the_legacy_fedavg() -> None:
    assert isinstance(Server(client_manager=SimpleClientManager()).strategy, FedAvg)


def test_a_failing_client_is_a_failure_of_the_round_not_of_the_run() -> None:
    nodes = Nodes([1, 2, 3], failing={2})
    proxies = [GridClientProxy(node_id=n, grid=nodes, run_id=7) for n in nodes.node_ids]
    ins = FitIns(ndarrays_to_parameters([np.zeros(3)]), {"lr": 0.5})

    results, failures = fit_clients([(p, ins) for p in proxies], None, None, 1)

    assert sorted(int(proxy.cid) for proxy, _ in results) == [1, 3]
    assert [res.metrics for _, res in results] == [{"seen": 0.5}] * 2
    [failure] = failures
    assert isinstance(failure, ErrorReplyError)
    assert isinstance(failure, ValueError)
    assert "node 2 answered the train message with an error (code 2)" in str(failure)


def test_a_proxy_answers_get_parameters_and_raises_on_an_error_reply() -> None:
    nodes = Nodes([4], failing=set())
    proxy = GridClientProxy(node_id=4, grid=nodes, run_id=7)

    answer = proxy.get_parameters(GetParametersIns(config={}), timeout=None, group_id=0)

    assert answer.status.code == Code.OK
    assert parameters_to_ndarrays(answer.parameters)[0].tolist() == [0.0, 0.0, 0.0]
    assert nodes.sent[0].metadata.group_id == ""  # Flower's: no group for round 0
    nodes.failing.add(4)
    with pytest.raises(ValueError, match="code 2"):
        proxy.get_parameters(GetParametersIns(config={}), timeout=None, group_id=0)


def test_a_proxy_without_a_reply_raises() -> None:
    proxy = GridClientProxy(node_id=4, grid=Nodes([4], silent={4}), run_id=7)

    with pytest.raises(ErrorReplyError, match="sent 0 replies"):
        proxy.fit(FitIns(ndarrays_to_parameters([np.zeros(3)]), {}), timeout=1.0, group_id=1)


class Raising(ClientProxy):
    def get_properties(self, ins: Any, timeout: Any, group_id: Any) -> Any:
        raise NotImplementedError

    get_parameters = evaluate = reconnect = fit = get_properties


def test_fit_clients_collects_exceptions() -> None:
    ins = FitIns(ndarrays_to_parameters([np.zeros(1)]), {})

    results, failures = fit_clients([(Raising("0"), ins), (Raising("1"), ins)], 1, None, 0)

    assert results == []
    assert [type(failure) for failure in failures] == [NotImplementedError] * 2


def test_server_app_refuses_mixing_its_forms() -> None:
    def server_fn(context: Context) -> ServerAppComponents:
        return ServerAppComponents()

    with pytest.raises(ValueError, match="Use `server_fn` exclusively"):
        ServerApp(server_fn=server_fn, config=ServerConfig(num_rounds=3))
    with_config = ServerApp(config=ServerConfig(num_rounds=3))
    with pytest.raises(ValueError, match="either a custom main function or a `Strategy`"):
        with_config.main()
    with_both = ServerApp(server_fn=server_fn)  # Flower allows it: main wins
    called = []
    with_both.main()(lambda grid, context: called.append(grid))
    with_both("grid", Context(run_id=1, node_id=0))
    assert called == ["grid"]


def test_server_app_runs_server_fn_on_the_grid_and_returns_the_history() -> None:
    nodes = Nodes([1, 2])
    seen: list[int] = []

    def server_fn(context: Context) -> ServerAppComponents:
        seen.append(context.run_id)
        return ServerAppComponents(strategy=fedavg(2), config=ServerConfig(num_rounds=3))

    history = ServerApp(server_fn=server_fn)(nodes, Context(run_id=7, node_id=0))

    assert seen == [7]
    assert isinstance(history, History)
    assert history.losses_distributed == [(1, 3.0), (2, 6.0), (3, 9.0)]


def test_default_workflow_fills_the_legacy_contexts_history() -> None:
    nodes = Nodes([1, 2])
    context = LegacyContext(
        Context(run_id=7, node_id=0, run_config={"x": 1}),
        config=ServerConfig(num_rounds=2),
        strategy=fedavg(2),
    )

    DefaultWorkflow()(nodes, context)

    assert context.history.losses_distributed == [(1, 3.0), (2, 6.0)]
    assert context.run_config == {"x": 1}
    model = context.state.array_records["parameters"].to_numpy_ndarrays()
    assert [array.tolist() for array in model] == [[2.0, 2.0, 2.0]]
    assert context.state.config_records["config"]["current_round"] == 2


def test_default_workflow_waits_no_longer_than_the_round_timeout() -> None:
    # Flower's workflow ignores round_timeout; fedcore's waits that long at most, and a
    # node that did not answer in time is a failure of the round.
    nodes = Nodes([1, 2, 3], silent={3})
    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=1.0,
        min_available_clients=3,
        # Not asked of a random node, which may be the silent one.
        initial_parameters=ndarrays_to_parameters([np.zeros(3)]),
    )
    context = LegacyContext(
        Context(run_id=7, node_id=0),
        config=ServerConfig(num_rounds=1, round_timeout=5.0),
        strategy=strategy,
    )
    failures: list[Any] = []
    aggregate_fit = strategy.aggregate_fit

    def spy(server_round: int, results: Any, round_failures: Any) -> Any:
        failures.extend(round_failures)
        return aggregate_fit(server_round, results, round_failures)

    strategy.aggregate_fit = spy  # type: ignore[method-assign]

    DefaultWorkflow()(nodes, context)

    assert set(nodes.timeouts) == {5.0}
    [failure] = failures
    assert isinstance(failure, ErrorReplyError)
    assert "node 3 did not answer the train message in time" in str(failure)
    assert context.history.losses_distributed == [(1, 3.0)]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_round_whose_config_cannot_be_sent_says_why_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Flower's tamuna puts a torch.Tensor into FitIns.config: every fit fails, and
    # neither Flower nor a strategy says why.
    nodes = Nodes([1, 2, 3])
    strategy = FedAvg(
        min_fit_clients=3,
        min_evaluate_clients=3,
        min_available_clients=3,
        on_fit_config_fn=lambda server_round: {"mask": {1, 2}},
    )
    server = Server(client_manager=registered(nodes), strategy=strategy)

    with caplog.at_level(logging.WARNING, logger="flwr"):
        server.fit(num_rounds=1, timeout=None)

    [warning] = [w for w in _warnings(caplog) if "failed" in w]
    assert warning.startswith("fit failed for 3 client(s) in round 1: TypeError: ")
    assert "ConfigRecord['mask']" in warning
    assert "got set" in warning


def test_the_default_workflow_says_why_clients_failed_one_line_per_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nodes = Nodes([1, 2, 3, 4], failing={2, 3}, silent={4})
    context = LegacyContext(
        Context(run_id=7, node_id=0),
        config=ServerConfig(num_rounds=1, round_timeout=5.0),
        strategy=FedAvg(initial_parameters=ndarrays_to_parameters([np.zeros(3)])),
    )

    with caplog.at_level(logging.WARNING, logger="flwr"):
        DefaultWorkflow()(nodes, context)

    fit = sorted(w for w in _warnings(caplog) if w.startswith("fit failed"))
    assert fit == [
        "fit failed for 1 client(s) in round 1: ErrorReplyError: the node did not answer "
        "the train message in time",
        "fit failed for 2 client(s) in round 1: ErrorReplyError: the node answered the "
        "train message with an error (code 2): the ClientApp raised",
    ]


def test_default_workflow_needs_a_legacy_context() -> None:
    with pytest.raises(TypeError, match="Expect a LegacyContext, but get Context"):
        DefaultWorkflow()(Nodes([1]), Context(run_id=7, node_id=0))


def test_messages_of_the_legacy_calls_are_valid_message_types() -> None:
    content = conversion.getparametersins_to_recorddict(GetParametersIns(config={}))
    for message_type in ("get_parameters", "get_properties"):
        assert Message(content, 1, message_type).metadata.message_type == message_type
    with pytest.raises(ValueError, match="message_type must be"):
        Message(RecordDict(), 1, "get_parameters.fast")


@pytest.mark.parametrize(
    ("module", "name"),
    [("flwr.server", "start_server"), ("flwr.client", "start_client"),
     ("flwr.client", "start_numpy_client")],
)  # fmt: skip
def test_flowers_own_wire_entry_points_import_with_one_line_and_refuse_a_call(
    module: str, name: str
) -> None:
    # Flower's e2e apps import start_client beside NumPyClient and call it only as scripts.
    code = (
        "import logging; logging.basicConfig(format='%(levelname)s %(message)s')\n"
        "from fedcore.apps.flower_imports import install_flower_imports\n"
        "install_flower_imports()\n"
        f"from {module} import {name}\n"
        "try:\n"
        f"    {name}(server_address='127.0.0.1:8080')\n"
        "except ValueError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )

    line = (
        f"{module}.{name} talks Flower's own wire protocol, which fedcore does not speak, so "
        "calling it fails: run the app with `fedcore run` on a fedcore link, or `fedcore simulate`"
    )
    assert done.stderr.splitlines() == [f"WARNING {line}"]
    assert done.stdout.splitlines() == [f"UsageError {line}"]


def test_a_proxy_takes_the_calls_of_flower_releases_before_group_id() -> None:
    # Baselines written for Flower 1.5 (niid_bench's SCAFFOLD) call fit(ins, timeout=...).
    proxy = GridClientProxy(node_id=4, grid=Nodes([4]), run_id=7)

    res = proxy.fit(FitIns(ndarrays_to_parameters([np.zeros(3)]), {}), timeout=None)
    parameters = proxy.get_parameters(GetParametersIns(config={}), timeout=None).parameters

    assert parameters_to_ndarrays(res.parameters)[0].tolist() == [1.0, 1.0, 1.0]
    assert parameters_to_ndarrays(parameters)[0].tolist() == [0.0, 0.0, 0.0]


def test_a_server_subclass_of_an_older_flower_gets_its_initial_parameters_called() -> None:
    # niid_bench's SCAFFOLD server overrides _get_initial_parameters(self, timeout).
    class OlderServer(Server):
        def _get_initial_parameters(self, timeout: float | None) -> Parameters:  # type: ignore[override]
            return ndarrays_to_parameters([np.full(3, 5.0)])

    nodes = Nodes([11, 12])
    server = OlderServer(client_manager=registered(nodes), strategy=fedavg(2))

    history, _ = server.fit(num_rounds=1, timeout=30.0)

    assert parameters_to_ndarrays(server.parameters)[0].tolist() == [6.0, 6.0, 6.0]
    assert history.losses_distributed == [(1, 18.0)]
