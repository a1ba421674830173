"""The ServerApp process of a deployed run: ``python -m fedcore.runtime.serverapp``.

An exec starts it with the run id, the link's runtime API address and the unpacked
app directory in its environment, and the launch secret in a pipe whose descriptor
the environment names (:data:`~fedcore.roles.exec.launcher.SECRET_FD_ENV`): never in
the environment, which ``/proc/PID/environ`` shows other processes of the same user
for as long as the process lives, nor on the command line. Before it reads the secret
the process makes itself non-dumpable (:mod:`fedcore.non_dumpable`), so that another
run's ServerApp of the same user cannot read the secret out of its memory; the secret
is read and the pipe closed before the app's code is imported. It loads the app, runs ``main``
against a :class:`~fedcore.transport.grid.LinkGrid`, and ends the run
itself: ``finished:completed`` when ``main`` returns, ``finished:failed`` with the
exception when it raises. Meanwhile it heartbeats, so the link fails the run if this
process dies, and a heartbeat refused because the run has finished (an operator
stopped it) ends the process. What the app logs and prints goes to the run's log
(``fedcore log RUN_ID``), and also to this process's own output, which the exec
keeps in a file.

It keeps the run's record on the link as ``fedcore simulate`` keeps a results
directory, in the same form (:mod:`fedcore.results.metrics`): a header line when it
starts (with the app's name and the nodes online), a line per round its strategy
reports, sent as each round ends, and the final model as the run's ``model``
artifact when ``main`` returns one (an ArrayRecord or a strategy's ``Result``). Every
line is on the link before the run is finished, so whoever follows the run's metrics
to its end has them all. ``fedcore pull`` and ``fedcore run --stream`` make a results
directory of it.

A process its exec may start again (``--max-restarts``, :data:`MAX_RESTARTS_ENV`) keeps
the run's round checkpoint (:mod:`fedcore.strategy.checkpoint`) on the link as the
artifact ``checkpoint``, replaced after every round; one started again
(:data:`RESTART_ENV`) reads it and its ``main``'s ``strategy.start`` goes on after
that round (with no checkpoint yet, from the first). Every round is in the record
once, however the process died: each round's line is a batch of its own, named by
the round, sent before its checkpoint, and the link appends a batch under the name it
appended last only once — so the line of a round done again after a kill between its
line and its checkpoint is not appended twice. A restarted process sends no second
header. The nodes' contexts stay on the link as they are.

Its exec's ``--max-value-bytes`` (:data:`MAX_VALUE_ENV`) caps one str or bytes value of a
record: a push holding a longer one raises :class:`~fedcore.errors.ValueTooLargeError`
in ``main`` (the run fails, naming the value), and a reply or context holding one is
refused as it is decoded.

A run whose strategy's last round got no successful training reply is
``finished:failed`` with that reason, as ``fedcore simulate`` exits 1 for it.

Exit status: 0 for a run completed or stopped, 1 for a run failed here, 2 when the
process cannot start (a missing variable, an unreachable link).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from fedcore.apps.loading import load_app
from fedcore.apps.project import read_project
from fedcore.clock import Clock, SystemClock
from fedcore.domain import SERVER_NODE_ID, Context, RecordDict, Run, RunStatus
from fedcore.domain.run import CHECKPOINT_ARTIFACT, MODEL_ARTIFACT
from fedcore.errors import FedcoreError, NotFoundError, RunFinishedError, first_error
from fedcore.event_loop import run_loop
from fedcore.non_dumpable import make_non_dumpable
from fedcore.results.directory import final_model
from fedcore.results.metrics import round_row, run_header
from fedcore.results.run_record import RunRecord
from fedcore.roles.exec.launcher import (
    APP_DIR_ENV,
    HEARTBEAT_ENV,
    MAX_RESTARTS_ENV,
    MAX_VALUE_ENV,
    RESTART_ENV,
    RUN_ID_ENV,
    RUNTIME_ENV,
    SECRET_FD_ENV,
)
from fedcore.runtime.addresses import parse_address
from fedcore.runtime.logship import LogShipper, Shipper
from fedcore.strategy.checkpoint import Checkpoint
from fedcore.strategy.result import RoundReport
from fedcore.transport.grid import LinkGrid
from fedcore.transport.http.runtime import HttpRuntimeClient
from fedcore.wire import MAX_VALUE_LEN

log = logging.getLogger("fedcore.serverapp")


class _Stopped(Exception):
    """The link says the run has finished: stop ``main``."""


async def serve_run(
    run_id: int,
    secret: str,
    address: str,
    app_dir: Path,
    heartbeat: float,
    clock: Clock,
    *,
    restart: int = 0,
    max_restarts: int = 0,
    max_value_len: int = MAX_VALUE_LEN,
) -> int:
    """Run the ServerApp of ``run_id``; return the process's exit status. ``restart``:
    which start of the process this is; ``max_restarts``: its exec's limit;
    ``max_value_len``: the cap on one str or bytes value of a record, pushed or decoded."""
    target = parse_address(address, what="runtime API address")
    async with HttpRuntimeClient(
        target.host, target.port, secret=secret, max_value_len=max_value_len
    ) as client:
        run = await client.authenticate(run_id, secret)
        grid = LinkGrid.deployed(client, run, clock, max_value_len=max_value_len)

        async def ship(lines: list[str], batch: str) -> None:
            await grid.call(lambda: client.append_logs(run_id, lines, batch=batch))

        async def report(lines: list[tuple[str, dict[str, Any]]], batch: str) -> None:
            documents = [document for _, document in lines]
            await grid.call(lambda: client.append_metrics(run_id, documents, batch=batch))

        async with LogShipper(ship) as shipper:
            context = Context(run_id, SERVER_NODE_ID, {}, RecordDict(), dict(run.run_config))
            async with Shipper(report, named=_line_name) as metrics:
                if restart == 0:
                    metrics.put(("header", await _header(grid, client, run, app_dir)))
                store, resume_from = None, None
                if max_restarts > 0:
                    store = _LinkCheckpoints(grid, client, run_id, metrics)
                    resume_from = await store.last() if restart > 0 else None
                record = RunRecord(_Rounds(metrics.put), store=store, resume_from=resume_from)
                with record, record.checkpointing():
                    failure, value = await _main(grid, client, context, app_dir, heartbeat)
            # The metrics are all on the link now, before the run finishes.
            if failure is None:
                await grid.call(lambda: client.save_context(run_id, context.state))
                model = final_model(value)
                if model is not None:
                    kept = RecordDict({"arrays": model})
                    await grid.call(lambda: client.put_artifact(run_id, MODEL_ARTIFACT, kept))
            status, reason = _outcome(failure, record.unfinished())
            if status is RunStatus.FAILED and not isinstance(failure, _Stopped):
                # Said and shipped before the run finishes: whoever follows its log
                # (`fedcore run --stream`) stops at the finish. A run finished otherwise
                # first (a stop) ends its log on that instead, below.
                try:
                    await grid.call(lambda: client.heartbeat(run_id, heartbeat))
                except RunFinishedError:
                    pass
                else:
                    _say_failed(failure, reason)
                    await shipper.drain()
            done = await grid.call(lambda: client.finish(run_id, status, reason))
            if (done.status, done.reason) != (status, reason):
                # The run had finished otherwise first (a stop, the link failing it).
                # A stop drops the run's messages under ``main``: what it raised then
                # (code-3 replies it did not expect, a refused push) is the stop's doing,
                # so the run's log ends on the stop whichever call noticed it first.
                _say_finished(done)
                return 0
            return 0 if status is RunStatus.COMPLETED else 1


async def _header(
    grid: LinkGrid, client: HttpRuntimeClient, run: Run, app_dir: Path
) -> dict[str, Any]:
    """The run's first metrics line: :func:`~fedcore.results.metrics.run_header`'s, and
    what ``run.json`` says of a deployed run besides: its app, and the nodes online."""
    nodes = await grid.call(lambda: client.get_node_ids(run.run_id))
    return {
        **run_header(run.run_id, run.seed, dict(run.run_config), grid.clock.now()),
        "app": read_project(app_dir).name,
        "backend": "deployment",
        "nodes": len(nodes),
    }


def _outcome(failure: Exception | None, unfinished: str | None) -> tuple[RunStatus, str]:
    """How ``main`` ended the run, as this process reports it to the link: ``unfinished``
    says why a run whose ``main`` returned did not complete (:meth:`RunRecord.unfinished`).
    """
    if failure is not None:
        return RunStatus.FAILED, _one_line(failure)
    if unfinished is not None:
        return RunStatus.FAILED, unfinished
    return RunStatus.COMPLETED, ""


async def _main(
    grid: LinkGrid,
    client: HttpRuntimeClient,
    context: Context,
    app_dir: Path,
    heartbeat: float,
) -> tuple[Exception | None, object]:
    """Run ``main`` beside the heartbeats; the exception that ended it, if any, and what
    it returned."""
    run_id = context.run_id
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_heartbeat, grid, client, run_id, heartbeat)
            loaded = load_app(app_dir)
            context.state = await grid.call(lambda: client.load_context(run_id))
            value = await loaded.app.server.run(grid, context)
            tasks.cancel_scope.cancel()
    except ExceptionGroup as group:
        return _first(group), None
    return None, value


async def _heartbeat(grid: LinkGrid, client: HttpRuntimeClient, run_id: int, every: float) -> None:
    """Heartbeat on a fixed cadence: a slow answer does not push the next beat later."""
    clock = grid.clock
    next_beat = clock.now()
    while True:
        try:
            await grid.call(lambda: client.heartbeat(run_id, every))
        except RunFinishedError:
            raise _Stopped from None
        next_beat = max(next_beat + every, clock.now())
        await clock.sleep(next_beat - clock.now())


class _LinkCheckpoints:
    """The run's round checkpoint, kept on the link as its ``checkpoint`` artifact."""

    def __init__(
        self,
        grid: LinkGrid,
        client: HttpRuntimeClient,
        run_id: int,
        metrics: Shipper[tuple[str, dict[str, Any]]],
    ) -> None:
        self._grid, self._client, self._run_id, self._metrics = grid, client, run_id, metrics

    async def save(self, records: RecordDict) -> None:
        """The round's line on the link first, then its checkpoint (see the module)."""
        await self._metrics.drain()
        await self._grid.call(
            lambda: self._client.put_artifact(self._run_id, CHECKPOINT_ARTIFACT, records)
        )

    async def last(self) -> Checkpoint | None:
        """The checkpoint the run's previous process left, if it left one."""
        try:
            records = await self._grid.call(
                lambda: self._client.get_artifact(self._run_id, CHECKPOINT_ARTIFACT)
            )
        except NotFoundError:
            log.info("no round checkpoint on the link: main starts from its first round")
            return None
        return Checkpoint.from_records(records)


def _line_name(line: tuple[str, dict[str, Any]]) -> str:
    return line[0]


class _Rounds(logging.Handler):
    """Hears the rounds a strategy reports (its log record carries the report): hands
    each round's metrics line to ``report``, named by its round.

    A second round of the same number (a ``main`` with two ``start`` calls) is named
    apart: ``round-3``, then ``round-3-2``.
    """

    def __init__(self, report: Callable[[tuple[str, dict[str, Any]]], None]) -> None:
        super().__init__()
        self._report = report
        self._seen: Counter[int] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        report = getattr(record, "fedcore_round", None)
        if isinstance(report, RoundReport):
            self._seen[report.server_round] += 1
            seen = self._seen[report.server_round]
            name = f"round-{report.server_round}" + (f"-{seen}" if seen > 1 else "")
            try:
                self._report((name, round_row(report)))
            except Exception:  # a logging handler must never raise into the code that logged
                self.handleError(record)


def _say_failed(failure: Exception | None, reason: str) -> None:
    """Why the run failed, in its log: the ServerApp's traceback, else the reason."""
    if failure is not None:
        log.error("the ServerApp failed:\n%s", "".join(traceback.format_exception(failure)))
    else:
        log.error("%s", reason)


def _say_finished(run: Run) -> None:
    """The last line of a run that ended under its ServerApp (a stop, the link failing it)."""
    reason = f" ({run.reason})" if run.reason else ""
    log.info("run %d is %s%s; the ServerApp ends", run.run_id, run.status, reason)


def _first(group: ExceptionGroup[Exception]) -> Exception:
    """The exception that ended ``main``: a stop wins over what the stop itself caused."""
    stopped, _ = group.split(_Stopped)
    return first_error(stopped or group)


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()
    return text[0][:500] if text else type(exc).__name__


def _read_secret(descriptor: int) -> str:
    """The launch secret: all the pipe at ``descriptor`` holds; the pipe is closed then."""
    chunks = []
    try:
        while chunk := os.read(descriptor, 4096):
            chunks.append(chunk)
    finally:
        os.close(descriptor)
    secret = b"".join(chunks).decode()
    if not secret:
        raise ValueError("an empty launch secret")
    return secret


def main() -> None:
    """The process's entry point: read the environment, run, exit with the status."""
    make_non_dumpable()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        run_id = int(os.environ[RUN_ID_ENV])
        secret = _read_secret(int(os.environ.pop(SECRET_FD_ENV)))
        address = os.environ[RUNTIME_ENV]
        app_dir = Path(os.environ[APP_DIR_ENV])
        heartbeat = float(os.environ[HEARTBEAT_ENV])
        restart = int(os.environ.get(RESTART_ENV, "0"))
        max_restarts = int(os.environ.get(MAX_RESTARTS_ENV, "0"))
        max_value_len = int(os.environ.get(MAX_VALUE_ENV, str(MAX_VALUE_LEN)))
        if max_value_len < 1:
            raise ValueError(f"{MAX_VALUE_ENV}={max_value_len}: it must be at least 1")
    except (KeyError, ValueError, OSError) as exc:
        print(
            f"error: a ServerApp process is started by an exec; missing or bad {exc}",
            file=sys.stderr,
        )
        sys.exit(2)
    try:
        code = run_loop(
            partial(
                serve_run,
                restart=restart,
                max_restarts=max_restarts,
                max_value_len=max_value_len,
            ),
            run_id,
            secret,
            address,
            app_dir,
            heartbeat,
            SystemClock(),
        )
    except FedcoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code)


if __name__ == "__main__":
    main()
