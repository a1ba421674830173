"""The legacy ``Server``: Flower's round loop over ``ClientProxy`` calls.

``fit`` asks the strategy for initial parameters (or one random client for its own),
then, each round, lets the strategy pick clients and instructions, calls them all at
once from a thread pool (:func:`fit_clients`, :func:`evaluate_clients`) and hands the
results and failures back to the strategy to aggregate, filling a
:class:`~fedcore.legacy.history.History`. A client call that raises is a failure of
the round, never of the run. Each proxy call blocks its worker thread only: in
fedcore a proxy is a :class:`~fedcore.legacy.grid_client_proxy.GridClientProxy`
whose Message goes through the run's Grid.

The log lines are Flower's (``[INIT]``, ``[ROUND n]``, ``configure_fit: …``,
``[SUMMARY]``), on the ``flwr`` logger, since users and scripts read them. Beyond
Flower's, a round with failures says why (:func:`log_failures`): Flower counts them
only, and a strategy's ``config`` value that cannot be sent fails every client in
silence.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import io
import logging
import re
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

from fedcore.clock import current_clock
from fedcore.domain.records import MetricValue
from fedcore.legacy.client_manager import ClientManager, SimpleClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.history import History
from fedcore.legacy.server_config import ServerConfig
from fedcore.legacy.strategy import FedAvg, Strategy
from fedcore.legacy.types import (
    Code,
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    Parameters,
    ReconnectIns,
    Scalar,
    Status,
)
from fedcore.strategy.result import RoundReport

_log = logging.getLogger("flwr")
_report_log = logging.getLogger("fedcore.legacy")

Ins = TypeVar("Ins")
Res = TypeVar("Res", FitRes, EvaluateRes, DisconnectRes)
ResultsAndFailures: TypeAlias = tuple[
    list[tuple[ClientProxy, Res]], list[tuple[ClientProxy, Res] | BaseException]
]
FitResultsAndFailures: TypeAlias = ResultsAndFailures[FitRes]
EvaluateResultsAndFailures: TypeAlias = ResultsAndFailures[EvaluateRes]
ReconnectResultsAndFailures: TypeAlias = ResultsAndFailures[DisconnectRes]


class Server:
    """Runs ``num_rounds`` of a legacy strategy over the clients of ``client_manager``."""

    def __init__(self, *, client_manager: ClientManager, strategy: Strategy | None = None) -> None:
        self._client_manager = client_manager
        self.parameters = Parameters(tensors=[], tensor_type="numpy.ndarray")
        self.strategy: Strategy = strategy if strategy is not None else FedAvg()
        self.max_workers: int | None = None

    def set_max_workers(self, max_workers: int | None) -> None:
        """How many client calls run at once (None: the thread pool's default)."""
        self.max_workers = max_workers

    def set_strategy(self, strategy: Strategy) -> None:
        self.strategy = strategy

    def client_manager(self) -> ClientManager:
        return self._client_manager

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:
        """Run ``num_rounds`` rounds; the History and the seconds the rounds took."""
        history = History()
        _log.info("[INIT]")
        # Server subclasses written for older releases (niid_bench's SCAFFOLD) take no server_round.
        if "server_round" in inspect.signature(self._get_initial_parameters).parameters:
            self.parameters = self._get_initial_parameters(server_round=0, timeout=timeout)
        else:
            self.parameters = self._get_initial_parameters(timeout=timeout)  # type: ignore[call-arg]
        _log.info("Starting evaluation of initial global parameters")
        initial = self.strategy.evaluate(0, parameters=self.parameters)
        if initial is not None:
            _log.info("initial parameters (loss, other metrics): %s, %s", *initial)
            history.add_loss_centralized(server_round=0, loss=initial[0])
            history.add_metrics_centralized(server_round=0, metrics=initial[1])
        else:
            _log.info("Evaluation returned no results (`None`)")

        clock = current_clock()
        start = clock.now()
        for current_round in range(1, num_rounds + 1):
            _log.info("")
            _log.info("[ROUND %s]", current_round)
            round_start = clock.now()
            report = RoundTally(current_round, num_rounds)
            fitted = self.fit_round(server_round=current_round, timeout=timeout)
            if fitted is not None:
                parameters, fit_metrics, (results, failures) = fitted
                report.trained(results, failures, fit_metrics)
                if parameters:
                    self.parameters = parameters
                history.add_metrics_distributed_fit(server_round=current_round, metrics=fit_metrics)

            centralized = self.strategy.evaluate(current_round, parameters=self.parameters)
            if centralized is not None:
                loss, metrics = centralized
                report.centralized(loss, metrics)
                _log.info(
                    "fit progress: (%s, %s, %s, %s)",
                    current_round,
                    loss,
                    metrics,
                    clock.now() - start,
                )
                history.add_loss_centralized(server_round=current_round, loss=loss)
                history.add_metrics_centralized(server_round=current_round, metrics=metrics)

            evaluated = self.evaluate_round(server_round=current_round, timeout=timeout)
            if evaluated is not None:
                loss_distributed, evaluate_metrics, (eval_results, eval_failures) = evaluated
                report.evaluated(eval_results, eval_failures, loss_distributed, evaluate_metrics)
                if loss_distributed is not None:
                    history.add_loss_distributed(server_round=current_round, loss=loss_distributed)
                    history.add_metrics_distributed(
                        server_round=current_round, metrics=evaluate_metrics
                    )
            report.log(clock.now() - round_start)
        return history, clock.now() - start

    def fit_round(
        self, server_round: int, timeout: float | None
    ) -> tuple[Parameters | None, dict[str, Scalar], FitResultsAndFailures] | None:
        """One round of training: None if the strategy picked no client."""
        instructions = self.strategy.configure_fit(
            server_round=server_round,
            parameters=self.parameters,
            client_manager=self._client_manager,
        )
        if not instructions:
            _log.info("configure_fit: no clients selected, cancel")
            return None
        _log.info(
            "configure_fit: strategy sampled %s clients (out of %s)",
            len(instructions),
            self._client_manager.num_available(),
        )
        results, failures = fit_clients(
            instructions, max_workers=self.max_workers, timeout=timeout, group_id=server_round
        )
        _log.info("aggregate_fit: received %s results and %s failures", len(results), len(failures))
        log_failures(failures, "fit", server_round)
        parameters, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        return parameters, metrics, (results, failures)

    def evaluate_round(
        self, server_round: int, timeout: float | None
    ) -> tuple[float | None, dict[str, Scalar], EvaluateResultsAndFailures] | None:
        """One round of distributed evaluation: None if the strategy picked no client."""
        instructions = self.strategy.configure_evaluate(
            server_round=server_round,
            parameters=self.parameters,
            client_manager=self._client_manager,
        )
        if not instructions:
            _log.info("configure_evaluate: no clients selected, skipping evaluation")
            return None
        _log.info(
            "configure_evaluate: strategy sampled %s clients (out of %s)",
            len(instructions),
            self._client_manager.num_available(),
        )
        results, failures = evaluate_clients(
            instructions, max_workers=self.max_workers, timeout=timeout, group_id=server_round
        )
        _log.info(
            "aggregate_evaluate: received %s results and %s failures",
            len(results),
            len(failures),
        )
        log_failures(failures, "evaluate", server_round)
        loss, metrics = self.strategy.aggregate_evaluate(server_round, results, failures)
        return loss, metrics, (results, failures)

    def disconnect_all_clients(self, timeout: float | None) -> None:
        """Tell every registered client the run is over (a no-op for Grid clients)."""
        clients = list(self._client_manager.all().values())
        reconnect_clients(
            [(client, ReconnectIns(seconds=None)) for client in clients],
            max_workers=self.max_workers,
            timeout=timeout,
        )

    def _get_initial_parameters(self, server_round: int, timeout: float | None) -> Parameters:
        """The strategy's initial parameters, or those of one client picked at random."""
        parameters = self.strategy.initialize_parameters(client_manager=self._client_manager)
        if parameters is not None:
            _log.info("Using initial global parameters provided by strategy")
            return parameters
        _log.info("Requesting initial parameters from one random client")
        [client] = self._client_manager.sample(1)
        answer = client.get_parameters(
            ins=GetParametersIns(config={}), timeout=timeout, group_id=server_round
        )
        if answer.status.code == Code.OK:
            _log.info("Received initial parameters from one random client")
        else:
            _log.warning(
                "Failed to receive initial parameters from the client. "
                "Empty initial parameters will be used."
            )
        return answer.parameters


class RoundTally:
    """A legacy round as fedcore's round driver reports one (a
    :class:`~fedcore.strategy.result.RoundReport` on the ``fedcore.legacy`` logger), so
    the results directory's ``metrics.jsonl`` and progress displays get legacy rounds too."""

    def __init__(self, server_round: int, num_rounds: int) -> None:
        self.server_round = server_round
        self.num_rounds = num_rounds
        self.train_replies = self.evaluate_replies = 0
        self.train_failures: dict[str, int] = {}
        self.evaluate_failures: dict[str, int] = {}
        self.train: dict[str, MetricValue] = {}
        self.evaluate: dict[str, MetricValue] = {}
        self.server: dict[str, MetricValue] = {}

    def trained(self, results: list[Any], failures: list[Any], metrics: dict[str, Scalar]) -> None:
        self.train_replies = len(results)
        self.train_failures = _failure_labels(failures)
        self.train = _numbers(metrics)

    def evaluated(
        self,
        results: list[Any],
        failures: list[Any],
        loss: float | None,
        metrics: dict[str, Scalar],
    ) -> None:
        self.evaluate_replies = len(results)
        self.evaluate_failures = _failure_labels(failures)
        self.evaluate = _numbers({"loss": loss, **metrics} if loss is not None else metrics)

    def centralized(self, loss: float, metrics: dict[str, Scalar]) -> None:
        self.server = _numbers({"loss": loss, **metrics})

    def log(self, elapsed: float) -> None:
        report = RoundReport(
            server_round=self.server_round,
            num_rounds=self.num_rounds,
            train_replies=self.train_replies,
            evaluate_replies=self.evaluate_replies,
            elapsed=elapsed,
            train_failures=self.train_failures,
            evaluate_failures=self.evaluate_failures,
            train_metrics=self.train,
            evaluate_metrics=self.evaluate,
            server_metrics=self.server,
        )
        _report_log.info("%s", report.describe(), extra={"fedcore_round": report})


def _numbers(metrics: dict[str, Any]) -> dict[str, MetricValue]:
    """The numeric metrics (a legacy metric may also be a str, bytes or bool)."""
    return {
        key: value
        for key, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def _failure_labels(failures: list[Any]) -> dict[str, int]:
    """Failures counted by label: the exception's type, or the status code a client sent."""
    labels: Counter[str] = Counter()
    for failure in failures:
        if isinstance(failure, BaseException):
            labels[type(failure).__name__] += 1
        else:
            labels[f"status {failure[1].status.code.name}"] += 1
    return dict(labels)


def log_failures(failures: list[Any], step: str, server_round: int) -> None:
    """Each distinct reason among a round's ``failures`` once, with how many clients it
    failed: an exception's type and message (a config value a ConfigRecord cannot
    carry, a node's error reply, no reply in time) or the status a client sent."""
    reasons = Counter(_failure_reason(failure) for failure in failures)
    for reason, count in reasons.items():
        _log.warning(
            "%s failed for %d client(s) in round %s: %s", step, count, server_round, reason
        )


_NODE = re.compile(r"\bnode \d+ ")
"""The node a failure names, left out of its reason so that one cause is one line."""


def _failure_reason(failure: Any) -> str:
    if isinstance(failure, BaseException):
        return _NODE.sub("the node ", f"{type(failure).__name__}: {failure}")
    status: Status = failure[1].status
    return f"the client's status {status.code.name}: {status.message}"


def fit_clients(
    client_instructions: list[tuple[ClientProxy, FitIns]],
    max_workers: int | None,
    timeout: float | None,
    group_id: int,
) -> FitResultsAndFailures:
    """Each client's ``fit`` at once; an exception or a status other than OK is a failure."""
    return _call_clients(
        client_instructions,
        lambda client, ins: client.fit(ins, timeout=timeout, group_id=group_id),
        max_workers,
    )


def evaluate_clients(
    client_instructions: list[tuple[ClientProxy, EvaluateIns]],
    max_workers: int | None,
    timeout: float | None,
    group_id: int,
) -> EvaluateResultsAndFailures:
    """Each client's ``evaluate`` at once; an exception or a status other than OK is a failure."""
    return _call_clients(
        client_instructions,
        lambda client, ins: client.evaluate(ins, timeout=timeout, group_id=group_id),
        max_workers,
    )


def reconnect_clients(
    client_instructions: list[tuple[ClientProxy, ReconnectIns]],
    max_workers: int | None,
    timeout: float | None,
) -> ReconnectResultsAndFailures:
    """Each client's ``reconnect`` at once; an exception is a failure."""
    return _call_clients(
        client_instructions,
        lambda client, ins: client.reconnect(ins, timeout=timeout, group_id=None),
        max_workers,
    )


def _call_clients(
    client_instructions: list[tuple[ClientProxy, Ins]],
    call: Callable[[ClientProxy, Ins], Res],
    max_workers: int | None,
) -> ResultsAndFailures[Res]:
    """``call`` for each (client, instruction) in a thread pool, results apart from failures.

    There is no deadline here: each call is bounded by its timeout in the proxy itself.
    """

    def one(client: ClientProxy, ins: Ins) -> tuple[ClientProxy, Res]:
        return client, call(client, ins)

    results: list[tuple[ClientProxy, Res]] = []
    failures: list[tuple[ClientProxy, Res] | BaseException] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as executor:
        futures = [executor.submit(one, client, ins) for client, ins in client_instructions]
        for future in concurrent.futures.as_completed(futures):
            failure = future.exception()
            if failure is not None:
                failures.append(failure)
                continue
            result = future.result()
            status: Status | None = getattr(result[1], "status", None)
            if status is None or status.code == Code.OK:
                results.append(result)
            else:
                failures.append(result)
    return results, failures


def init_defaults(
    server: Server | None,
    config: ServerConfig | None,
    strategy: Strategy | None,
    client_manager: ClientManager | None,
) -> tuple[Server, ServerConfig]:
    """A server and a config from what was given, Flower's defaults for the rest."""
    if server is None:
        server = Server(
            client_manager=client_manager if client_manager is not None else SimpleClientManager(),
            strategy=strategy,
        )
    elif strategy is not None:
        _log.warning("Both server and strategy were provided, ignoring strategy")
    return server, config if config is not None else ServerConfig()


def run_fl(server: Server, config: ServerConfig) -> History:
    """``server.fit`` for ``config``'s rounds, then the ``[SUMMARY]`` Flower logs."""
    history, elapsed = server.fit(num_rounds=config.num_rounds, timeout=config.round_timeout)
    log_summary(history, config.num_rounds, elapsed, indent_first=True)
    server.disconnect_all_clients(timeout=config.round_timeout)
    return history


def log_summary(history: History, num_rounds: int, elapsed: float, *, indent_first: bool) -> None:
    """The ``[SUMMARY]`` block: rounds, seconds, and the History a line at a time.

    Flower's ``Server`` indents every line of the History; its ``DefaultWorkflow`` all
    but the first.
    """
    _log.info("")
    _log.info("[SUMMARY]")
    _log.info("Run finished %s round(s) in %.2fs", num_rounds, elapsed)
    for index, line in enumerate(io.StringIO(str(history))):
        if index == 0 and not indent_first:
            _log.info("%s", line.strip("\n"))
        else:
            _log.info("\t%s", line.strip("\n"))
    _log.info("")
