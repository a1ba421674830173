"""``LegacyContext`` and ``DefaultWorkflow``: a legacy strategy driven from a Message-API ``main``.

Flower's e2e apps and examples write::

    @app.main()
    def main(grid, context):
        context = LegacyContext(context, config=ServerConfig(num_rounds=3), strategy=FedAvg())
        DefaultWorkflow()(grid, context)

The workflow is the legacy ``Server``'s round loop written with Messages: each round
it asks the strategy for instructions, sends them to the chosen nodes in one
``send_and_receive`` and hands the replies, translated back (:mod:`fedcore.legacy.
conversion`), to the strategy. The global model lives in ``context.state`` (the
ArrayRecord ``"parameters"``, with the round in the ConfigRecord ``"config"``), so a
custom ``fit_workflow``/``evaluate_workflow`` reads and writes it there, as in Flower;
``context.history`` collects the losses and metrics. It takes the blocking grid of a
plain ``def main``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Any, cast

from fedcore.apps.grid import Grid
from fedcore.clock import current_clock
from fedcore.domain import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from fedcore.errors import ErrorReplyError
from fedcore.legacy import conversion
from fedcore.legacy.client_manager import ClientManager, SimpleClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.conversion import MessageTypeLegacy
from fedcore.legacy.grid_client_proxy import start_update_client_manager_thread
from fedcore.legacy.history import History
from fedcore.legacy.server import RoundTally, log_failures, log_summary
from fedcore.legacy.server_config import ServerConfig
from fedcore.legacy.strategy import FedAvg, Strategy
from fedcore.legacy.types import Code, EvaluateRes, FitRes, GetParametersIns, Parameters

_log = logging.getLogger("flwr")

Workflow = Callable[[Any, Context], None]
"""A step of a workflow: ``step(grid, context)`` with the blocking grid and a LegacyContext."""

MAIN_CONFIGS_RECORD = "config"
"""The ConfigRecord of ``context.state`` holding the round (``current_round``) and the
start time (``start_time``)."""
MAIN_PARAMS_RECORD = "parameters"
"""The ArrayRecord of ``context.state`` holding the global model."""
CURRENT_ROUND = "current_round"
START_TIME = "start_time"

_tally: ContextVar[RoundTally | None] = ContextVar("fedcore_legacy_round", default=None)
"""The round :class:`DefaultWorkflow` is running, which its default steps report into (as
the legacy ``Server`` reports its rounds); a step of the user's own reports nothing."""


@dataclass(init=False)
class LegacyContext(Context):
    """A server Context carrying the legacy run's config, strategy, client manager and
    History; each left out gets Flower's default (one round, ``FedAvg``,
    ``SimpleClientManager``). It shares ``context``'s state."""

    config: ServerConfig = field(init=False)
    strategy: Strategy = field(init=False)
    client_manager: ClientManager = field(init=False)
    history: History = field(init=False)

    def __init__(
        self,
        context: Context,
        config: ServerConfig | None = None,
        strategy: Strategy | None = None,
        client_manager: ClientManager | None = None,
    ) -> None:
        super().__init__(**{f.name: getattr(context, f.name) for f in fields(Context)})
        self.config = config if config is not None else ServerConfig()
        self.strategy = strategy if strategy is not None else FedAvg()
        self.client_manager = (
            client_manager if client_manager is not None else SimpleClientManager()
        )
        self.history = History()


class DefaultWorkflow:
    """Flower's default legacy workflow: initial parameters, then per round ``fit_workflow``,
    centralized evaluation and ``evaluate_workflow``, then the ``[SUMMARY]``."""

    def __init__(
        self, fit_workflow: Workflow | None = None, evaluate_workflow: Workflow | None = None
    ) -> None:
        self.fit_workflow: Workflow = fit_workflow or default_fit_workflow
        self.evaluate_workflow: Workflow = evaluate_workflow or default_evaluate_workflow

    def __call__(self, grid: Any, context: Context) -> None:
        legacy = _legacy(context)
        if isinstance(grid, Grid):
            raise TypeError(
                "DefaultWorkflow blocks on the grid: call it from a plain `def main(grid, "
                "context)`, whose grid is a SyncGrid, not from an `async def main`"
            )
        thread, stop, ready = start_update_client_manager_thread(grid, legacy.client_manager)
        ready.wait()
        try:
            _log.info("[INIT]")
            default_init_params_workflow(grid, legacy)
            clock = current_clock()
            start = clock.now()
            config = ConfigRecord({START_TIME: start})
            legacy.state[MAIN_CONFIGS_RECORD] = config
            for current_round in range(1, legacy.config.num_rounds + 1):
                _log.info("")
                _log.info("[ROUND %s]", current_round)
                config[CURRENT_ROUND] = current_round
                round_start = clock.now()
                tally = RoundTally(current_round, legacy.config.num_rounds)
                token = _tally.set(tally)
                try:
                    self.fit_workflow(grid, legacy)
                    default_centralized_evaluation_workflow(grid, legacy)
                    self.evaluate_workflow(grid, legacy)
                finally:
                    _tally.reset(token)
                tally.log(clock.now() - round_start)
            elapsed = clock.now() - start
            log_summary(legacy.history, legacy.config.num_rounds, elapsed, indent_first=False)
        finally:
            stop.set()
            thread.join()


def default_init_params_workflow(grid: Any, context: Context) -> None:
    """The strategy's initial parameters, or one random client's; then their
    centralized evaluation (round 0)."""
    legacy = _legacy(context)
    parameters = legacy.strategy.initialize_parameters(client_manager=legacy.client_manager)
    if parameters is not None:
        _log.info("Using initial global parameters provided by strategy")
        record = conversion.parameters_to_arrayrecord(parameters, True)
    else:
        _log.info("Requesting initial parameters from one random client")
        [client] = legacy.client_manager.sample(1)
        content = conversion.getparametersins_to_recorddict(GetParametersIns(config={}))
        message = Message(content, client.node_id, MessageTypeLegacy.GET_PARAMETERS, group_id="0")
        replies = grid.send_and_receive([message], timeout=legacy.config.round_timeout)
        answers = [
            conversion.recorddict_to_getparametersres(reply.content, True)
            for reply in replies
            if reply.has_content()
        ]
        if answers and answers[0].status.code == Code.OK:
            _log.info("Received initial parameters from one random client")
            record = conversion.parameters_to_arrayrecord(answers[0].parameters, True)
        else:
            _log.warning(
                "Failed to receive initial parameters from the client. "
                "Empty initial parameters will be used."
            )
            record = ArrayRecord()
    legacy.state[MAIN_PARAMS_RECORD] = record

    _log.info("Starting evaluation of initial global parameters")
    initial = legacy.strategy.evaluate(0, parameters=_parameters(legacy))
    if initial is not None:
        _log.info("initial parameters (loss, other metrics): %s, %s", *initial)
        legacy.history.add_loss_centralized(server_round=0, loss=initial[0])
        legacy.history.add_metrics_centralized(server_round=0, metrics=initial[1])
    else:
        _log.info("Evaluation returned no results (`None`)")


def default_centralized_evaluation_workflow(_: Any, context: Context) -> None:
    """The strategy's ``evaluate`` of the current global model."""
    legacy = _legacy(context)
    current_round = _current_round(legacy)
    centralized = legacy.strategy.evaluate(current_round, parameters=_parameters(legacy))
    if centralized is None:
        return
    loss, metrics = centralized
    start = cast(float, legacy.state.config_records[MAIN_CONFIGS_RECORD][START_TIME])
    _log.info(
        "fit progress: (%s, %s, %s, %s)",
        current_round,
        loss,
        metrics,
        current_clock().now() - start,
    )
    legacy.history.add_loss_centralized(server_round=current_round, loss=loss)
    legacy.history.add_metrics_centralized(server_round=current_round, metrics=metrics)
    if (tally := _tally.get()) is not None:
        tally.centralized(loss, metrics)


def default_fit_workflow(grid: Any, context: Context) -> None:
    """One round of training: the strategy's ``configure_fit``, the nodes' replies, its
    ``aggregate_fit``; the new global model into ``context.state``."""
    legacy = _legacy(context)
    current_round = _current_round(legacy)
    instructions = legacy.strategy.configure_fit(
        server_round=current_round,
        parameters=_parameters(legacy),
        client_manager=legacy.client_manager,
    )
    if not instructions:
        _log.info("configure_fit: no clients selected, cancel")
        return
    _log.info(
        "configure_fit: strategy sampled %s clients (out of %s)",
        len(instructions),
        legacy.client_manager.num_available(),
    )
    contents = [(proxy, conversion.fitins_to_recorddict(ins, True)) for proxy, ins in instructions]
    results, failures = _round_trip(
        grid,
        legacy,
        contents,
        MessageType.TRAIN,
        lambda c: conversion.recorddict_to_fitres(c, False),
    )
    _log.info("aggregate_fit: received %s results and %s failures", len(results), len(failures))
    log_failures(failures, "fit", current_round)
    parameters, metrics = legacy.strategy.aggregate_fit(current_round, results, failures)
    if (tally := _tally.get()) is not None:
        tally.trained(results, failures, metrics)
    if parameters:
        legacy.state[MAIN_PARAMS_RECORD] = conversion.parameters_to_arrayrecord(parameters, True)
        legacy.history.add_metrics_distributed_fit(server_round=current_round, metrics=metrics)


def default_evaluate_workflow(grid: Any, context: Context) -> None:
    """One round of distributed evaluation: ``configure_evaluate``, the nodes' replies,
    ``aggregate_evaluate``; the loss and metrics into ``context.history``."""
    legacy = _legacy(context)
    current_round = _current_round(legacy)
    instructions = legacy.strategy.configure_evaluate(
        server_round=current_round,
        parameters=_parameters(legacy),
        client_manager=legacy.client_manager,
    )
    if not instructions:
        _log.info("configure_evaluate: no clients selected, skipping evaluation")
        return
    _log.info(
        "configure_evaluate: strategy sampled %s clients (out of %s)",
        len(instructions),
        legacy.client_manager.num_available(),
    )
    contents = [
        (proxy, conversion.evaluateins_to_recorddict(ins, True)) for proxy, ins in instructions
    ]
    results, failures = _round_trip(
        grid, legacy, contents, MessageType.EVALUATE, conversion.recorddict_to_evaluateres
    )
    _log.info(
        "aggregate_evaluate: received %s results and %s failures", len(results), len(failures)
    )
    log_failures(failures, "evaluate", current_round)
    loss, metrics = legacy.strategy.aggregate_evaluate(current_round, results, failures)
    if (tally := _tally.get()) is not None:
        tally.evaluated(results, failures, loss, metrics)
    if loss is not None:
        legacy.history.add_loss_distributed(server_round=current_round, loss=loss)
        legacy.history.add_metrics_distributed(server_round=current_round, metrics=metrics)


def _round_trip(
    grid: Any,
    context: LegacyContext,
    contents: list[tuple[ClientProxy, RecordDict]],
    message_type: str,
    to_res: Callable[[RecordDict], Any],
) -> tuple[list[tuple[ClientProxy, Any]], list[Any]]:
    """Send each content to its proxy's node, at once; the answers as the strategy takes
    them: OK results apart from failures (a status not OK, an error reply, no reply in
    ``round_timeout``)."""
    current_round = _current_round(context)
    sent = [
        (proxy, Message(content, proxy.node_id, message_type, group_id=str(current_round)))
        for proxy, content in contents
    ]
    replies = grid.send_and_receive(
        [message for _, message in sent], timeout=context.config.round_timeout
    )
    waiting = {message.metadata.message_id: proxy for proxy, message in sent}
    results: list[tuple[ClientProxy, Any]] = []
    failures: list[Any] = []
    for reply in replies:
        proxy = waiting.pop(reply.metadata.reply_to_message_id)
        if not reply.has_content():
            failures.append(
                ErrorReplyError(
                    f"node {proxy.node_id} answered the {message_type} message with an "
                    f"error (code {reply.error.code}): {reply.error.reason}"
                )
            )
            continue
        res: FitRes | EvaluateRes = to_res(reply.content)
        (results if res.status.code == Code.OK else failures).append((proxy, res))
    for proxy in waiting.values():
        failures.append(
            ErrorReplyError(
                f"node {proxy.node_id} did not answer the {message_type} message in time"
            )
        )
    return results, failures


def _legacy(context: Context) -> LegacyContext:
    if not isinstance(context, LegacyContext):
        raise TypeError(f"Expect a LegacyContext, but get {type(context).__name__}.")
    return context


def _current_round(context: LegacyContext) -> int:
    return cast(int, context.state.config_records[MAIN_CONFIGS_RECORD][CURRENT_ROUND])


def _parameters(context: LegacyContext) -> Parameters:
    return conversion.arrayrecord_to_parameters(
        context.state.array_records[MAIN_PARAMS_RECORD], True
    )
