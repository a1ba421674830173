"""``simulate`` and ``run_simulation``: the front door of the simulation runtime.

``simulate`` is a coroutine, so it runs inside any event loop that is already
going — a Jupyter notebook, an async research script — and composes the pieces:
an in-memory LinkState seeded for reproducible ids, a backend, and the engine.
``run_simulation`` is the blocking form for scripts (and ``fedcore simulate``);
inside a running loop it refuses with a pointer to ``await fedcore.simulate(...)``
rather than failing obscurely. Owning its event loop, it also owns the process's
ending signals (:mod:`fedcore.event_loop`): Ctrl-C, SIGTERM and SIGHUP stop the run
cleanly, a second one exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcore.apps.app import App
from fedcore.apps.loading import load_app
from fedcore.apps.run_config import RunConfig, resolve_run_config
from fedcore.clock import Clock, SystemClock, using_clock
from fedcore.errors import UsageError
from fedcore.event_loop import run_until_ended
from fedcore.results.resume import Resumption, open_resumption
from fedcore.results.run_record import results_record
from fedcore.results.trackers import create_trackers
from fedcore.simulation.backends import DEFAULT_BACKEND, create_backend
from fedcore.simulation.engine import SimulationEngine, SimulationResult
from fedcore.simulation.progress import showing_progress, summary
from fedcore.simulation.resources import Resources
from fedcore.state.memory import InMemoryLinkState
from fedcore.strategy.arguments import positive
from fedcore.wire import MAX_VALUE_LEN
from fedcore.workers.shared_memory import remove_process_segments
from fedcore.workers.worker import WORKER_ENV

log = logging.getLogger(__name__)

_NO_NODE_COUNT = (
    "how many nodes to simulate? pass --nodes N (nodes=N), or declare it in the app's "
    "pyproject.toml: nodes = N under [tool.fedcore.app.simulation], or "
    "options.num-supernodes = N in a [tool.flwr.federations] entry"
)


async def simulate(
    app: App | str | Path,
    *,
    nodes: int | None = None,
    backend: str = DEFAULT_BACKEND,
    resources: Resources | None = None,
    run_config: Mapping[str, Any] | str | None = None,
    seed: int | None = None,
    system: Resources | None = None,
    max_workers: int | None = None,
    clock: Clock | None = None,
    round_timeout: float | None = None,
    max_value_bytes: int | None = None,
    progress: bool = True,
    federation: str | None = None,
    out: str | Path | None = None,
    ray_address: str | None = None,
    track: Sequence[str] = (),
    resume: str | Path | None = None,
) -> SimulationResult:
    """Run ``app`` on ``nodes`` virtual nodes and return what its ServerApp's main returned.

    ``app`` is an :class:`App`, a ``"module:attr"`` naming one, or an app directory.
    ``run_config`` overrides the app's declared defaults: a dict of values, or text
    as on the command line (``"num-server-rounds=5 lr=0.05"``). ``seed`` fixes node ids and
    sampling (default: the run config's ``seed``, else a random one, which the
    result reports so the run can be repeated); an app that declares a ``seed``
    run-config key receives this seed there, so its own randomness follows it too.

    ``backend="process"`` runs ClientApps in worker processes, as many as the machine
    (or ``system``) has room for at ``resources`` each, capped by ``max_workers``;
    ``"inline"`` runs them in this process; ``"ray"`` runs them in Ray actors, as many as
    the Ray cluster's nodes have room for, capped by ``max_workers``: the cluster at
    ``ray_address`` (default: ``$RAY_ADDRESS``), else a Ray started on this machine (or
    ``system``) for the run and stopped after it (the ``[ray]`` extra).

    ``nodes`` and ``resources`` default to what an app directory declares
    (``[tool.fedcore.app.simulation]``, else the Flower federation ``federation`` or
    its ``default`` names; see :mod:`fedcore.apps.project`); ``nodes`` must come from
    one or the other. ``resources`` given here is taken whole.

    ``round_timeout`` (seconds) is the run-wide default of strategies' own
    ``round_timeout``, for those the ServerApp built without one.

    ``max_value_bytes`` caps one str or bytes value of a record (default, or ``None``:
    Flower's 512 MiB cap on a message): pushing a message with a longer one raises
    :class:`~fedcore.errors.ValueTooLargeError`, and a reply with one becomes an error
    reply (code 2). Workers decode values up to it, and no longer ones.

    Unless ``progress=False`` or the caller configured logging (a handler on the
    root or ``fedcore`` logger, as ``logging.basicConfig`` adds), each round is logged
    to stderr and a summary printed at the end, as ``fedcore simulate`` shows them.

    ``out`` (a directory, made if need be) keeps the run's results directory under it,
    named ``<UTC time>-<app>-<seed>`` (:mod:`fedcore.results`), as ``fedcore simulate``
    does under ``results/``; ``result.out`` names it. fedcore's INFO records are
    produced while it runs, for the record, whatever the loggers' levels were.

    ``track`` names experiment trackers that record the run too, each ``"NAME"`` or
    ``"NAME=WHERE"`` as ``fedcore simulate --track`` takes them: ``"mlflow"``,
    ``"tensorboard"``, ``"wandb"`` (:mod:`fedcore.results.trackers`). One that cannot
    start raises :class:`~fedcore.errors.TrackerError` before the run begins; one that
    fails later is dropped with a warning, and the run goes on.

    A run that keeps a results directory keeps a checkpoint there after every round
    of its strategy's ``start`` (:mod:`fedcore.strategy.checkpoint`). ``resume`` names
    such a directory whose run did not complete: the run goes on from its last
    complete round, in that directory, with the nodes, seed and run config it started
    with (so ``nodes``, ``seed``, ``run_config``, ``federation`` and ``out`` are not
    given), and ends with the model the uninterrupted run would have, bit for bit.
    ``app`` is the one the run ran (``fedcore simulate --resume`` reads it from
    ``run.json``). It does not take ``track`` yet.
    """
    if os.environ.get(WORKER_ENV):
        raise UsageError(
            "a simulation was started inside a fedcore worker: the module that defines the "
            "ClientApp starts one when imported; put that under `if __name__ == '__main__':`"
        )
    resumption = None
    if resume is not None:
        resumption = _resumption(
            Path(resume),
            nodes=nodes,
            seed=seed,
            run_config=run_config,
            federation=federation,
            out=out,
            track=track,
        )
        nodes, seed = resumption.run["nodes"], resumption.run["seed"]
        run_config = resumption.run["config"]
    loaded = load_app(app, federation=federation)
    if federation is not None and loaded.path is None:
        raise UsageError("federation= picks defaults of an app directory; this app is not one")
    declared = loaded.simulation
    if nodes is None:
        nodes = declared.nodes
        if nodes is None:
            raise UsageError(_NO_NODE_COUNT)
        source = f" (from {declared.nodes_from})"
    else:
        source = ""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise UsageError(f"nodes must be a positive number, got {nodes!r}")
    if resources is None:
        resources = Resources(
            num_cpus=1.0 if declared.num_cpus is None else declared.num_cpus,
            num_gpus=0.0 if declared.num_gpus is None else declared.num_gpus,
        )
    for name, given in (("resources", resources), ("system", system)):
        if given is not None and not isinstance(given, Resources):
            raise TypeError(f"{name} must be fedcore.Resources, got {type(given).__name__}")
    config = resolve_run_config(loaded.config, run_config)
    seed = _resolve_seed(seed, config)
    if "seed" in config:
        config["seed"] = seed
    if round_timeout is not None:
        try:
            round_timeout = positive("round_timeout", round_timeout)
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from None
    if max_value_bytes is None:
        max_value_bytes = MAX_VALUE_LEN
    if isinstance(max_value_bytes, bool) or not isinstance(max_value_bytes, int):
        raise UsageError(f"max_value_bytes must be an int, got {max_value_bytes!r}")
    if max_value_bytes < 1:
        raise UsageError(f"max_value_bytes must be at least 1, got {max_value_bytes}")
    trackers = create_trackers(track) if track else []
    clock = clock or SystemClock()
    started = clock.now()
    with contextlib.ExitStack() as stack:
        stack.enter_context(using_clock(clock))  # messages built in this run stamp its time
        display = None
        if progress and not logging.getLogger("fedcore").hasHandlers():
            display = stack.enter_context(
                showing_progress(sys.stderr, show=logging.INFO, live=sys.stderr.isatty())
            )
        app_name = _app_name(app, loaded.path)
        description: dict[str, Any] = {
            "app": app_name,
            "target": _target(app),
            "config": config,
            "seed": seed,
            "backend": backend,
            "nodes": nodes,
            "resources": {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus},
        }
        async with results_record(
            description,
            out=None if out is None else Path(out),
            resumption=resumption,
            trackers=trackers,
            clock=clock,
            started=started,
        ) as record:
            log.info("simulating %d nodes%s on the %s backend, seed %d", nodes, source, backend,
                     seed)  # fmt: skip
            async with (
                InMemoryLinkState(clock, seed=seed) as state,
                create_backend(
                    backend,
                    loaded,
                    resources,
                    clock,
                    system=system,
                    max_workers=max_workers,
                    ray_address=ray_address,
                    max_value_len=max_value_bytes,
                ) as runner,
            ):
                engine = SimulationEngine(state, runner, clock, max_value_len=max_value_bytes)
                checkpoint = record.resume_from
                with record.checkpointing(nodes=engine.node_states):
                    result = await engine.run(
                        loaded.app.server,
                        num_nodes=nodes,
                        run_config=config,
                        seed=seed,
                        round_timeout=round_timeout,
                        node_states=None if checkpoint is None else checkpoint.nodes,
                    )
            await record.complete(result.value, clock.now())
            result.out = record.path
    if display is not None:
        print(summary(display.reports, clock.now() - started, result.seed))
    return result


def _resumption(
    path: Path,
    *,
    nodes: int | None,
    seed: int | None,
    run_config: Mapping[str, Any] | str | None,
    federation: str | None,
    out: str | Path | None,
    track: Sequence[str],
) -> Resumption:
    """The run to go on with in ``path``, refusing what would make it another run."""
    given = [
        name
        for name, value in (
            ("nodes", nodes),
            ("seed", seed),
            ("run_config", run_config or None),
            ("federation", federation),
        )
        if value is not None
    ]
    if given:
        raise UsageError(
            f"a resumed run keeps the {', '.join(given)} it was started with "
            f"(run.json in {str(path)!r}); leave {'them' if len(given) > 1 else 'it'} out"
        )
    if out is not None:
        raise UsageError(f"a resumed run goes on in its own results directory, {str(path)!r}")
    if track:
        raise UsageError("a resumed run does not take trackers yet; resume it without them")
    return open_resumption(path)


def _target(app: App | str | Path) -> str | None:
    """What ``fedcore simulate --resume`` loads the app from: its directory, made
    absolute, or its ``module:attr``; ``None`` for an App object."""
    if isinstance(app, App):
        return None
    if isinstance(app, str) and ":" in app and not Path(app).exists():
        return app
    return str(Path(app).resolve())


def _app_name(app: App | str | Path, path: Path | None) -> str:
    """What a results directory calls the app: its directory's name, else its module."""
    if path is not None:
        return path.resolve().name
    if isinstance(app, str):
        return app.partition(":")[0].rsplit(".", 1)[-1]
    return "app"


def run_simulation(app: App | str | Path, **options: Any) -> SimulationResult:
    """The blocking form of :func:`simulate`, for scripts; same arguments.

    Ctrl-C, SIGTERM or SIGHUP (those not ignored or handled by the caller) stop the
    run as its failure would: workers stopped, shared memory unlinked. It then raises
    ``KeyboardInterrupt`` for Ctrl-C and ``SystemExit(128 + signal)`` for the others
    (status 143 for SIGTERM, 129 for SIGHUP). A second signal ends the process at once.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise UsageError(
            "run_simulation() blocks, so it cannot run inside a running event loop "
            "(Jupyter, async code); use `await fedcore.simulate(...)` there"
        )
    result = run_until_ended(
        functools.partial(simulate, app, **options),
        "the simulation",
        abandon=_release_shared_memory,
    )
    assert result is not None, "only an ending signal cancels the run"
    return result


def _release_shared_memory() -> None:
    """Before an exit at once: end this process's workers, then unlink its segments.

    In that order: a worker still at a task would otherwise find its model's segment
    gone under it, and print a traceback on its way out.
    """
    for pid in _children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    remove_process_segments(os.getpid())


def _children() -> list[int]:
    """The pids of this process's children (Linux; elsewhere none are known)."""
    pids = []
    for task in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError):
            pids += [int(pid) for pid in task.read_text().split()]
    return pids


def _resolve_seed(seed: int | None, config: RunConfig) -> int:
    if seed is None:
        configured = config.get("seed")
        if isinstance(configured, int) and not isinstance(configured, bool):
            seed = configured
        else:
            return secrets.randbelow(2**32)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed must be a non-negative int, got {seed!r}")
    return seed
