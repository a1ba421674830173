"""``fedcore simulate``: run an app on virtual nodes from the command line."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fedcore.apps.run_config import parse_run_config
from fedcore.cli.results_dir import results_dir_options
from fedcore.defaults import BACKENDS, DEFAULT_BACKEND, DEFAULT_ROUND_TIMEOUT, MAX_VALUE_LEN
from fedcore.errors import RunConfigError

if TYPE_CHECKING:
    from fedcore.legacy.simulation import ScriptDefaults
    from fedcore.simulation import Resources, SimulationResult


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("target", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--module",
    "-m",
    metavar="MODULE",
    help="Run MODULE as `python -m MODULE ARGS` would (the current directory first on "
    "sys.path), its `import flwr...` answered by fedcore: a legacy Flower program, a "
    "Hydra app with its key=value overrides included. TARGET and ARGS are its arguments.",
)
@click.option(
    "--nodes",
    "-n",
    type=int,
    help="Number of virtual nodes to simulate (default: the app directory's: nodes under "
    "[tool.fedcore.app.simulation], else options.num-supernodes of its Flower federation).",
)
@click.option(
    "--federation",
    metavar="NAME",
    help="The [tool.flwr.federations] entry of the app directory that supplies the "
    "defaults of --nodes, --num-cpus and --num-gpus (default: the one its `default` names).",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=DEFAULT_BACKEND,
    show_default=True,
    help="Where ClientApps run: 'process' in a pool of worker processes sized by the "
    "resources below; 'inline' in this process (async handlers on the event loop, "
    "plain ones in threads); 'ray' in Ray actors sized by the same resources, on a Ray "
    "cluster or a Ray of the run's own (pip install 'fedcore[ray]').",
)
@click.option(
    "--ray-address",
    metavar="HOST:PORT",
    help="The Ray cluster the ray backend runs on: its head's address, as `ray start "
    "--head` prints it (default: $RAY_ADDRESS, else a Ray started on this machine for "
    "the run and stopped after it).",
)
@click.option(
    "--num-cpus",
    type=click.FloatRange(min=0, min_open=True),
    help="CPUs each ClientApp needs (process and ray backends; default: the app "
    "directory's, else 1). Each worker gets OMP_NUM_THREADS, "
    "MKL_NUM_THREADS and OPENBLAS_NUM_THREADS (so BLAS, OpenMP and torch) set to this, "
    "rounded up; one already set in the environment is kept.",
)
@click.option(
    "--num-gpus",
    type=click.FloatRange(min=0),
    help="GPUs each ClientApp needs; 0.25 packs four workers on a device (process and ray "
    "backends; default: the app directory's, else 0). The app directory's defaults are "
    "num-cpus and num-gpus under [tool.fedcore.app.simulation], else its Flower federation's "
    "options.backend.client-resources.",
)
@click.option(
    "--max-workers",
    type=click.IntRange(min=1),
    help="At most this many worker processes or Ray actors (default: as many as the "
    "resources allow).",
)
@click.option(
    "--system-cpus",
    type=click.FloatRange(min=0, min_open=True),
    help="CPUs the pool (or a Ray of the run's own) may use (default: those this process "
    "may run on).",
)
@click.option(
    "--system-gpus",
    type=click.FloatRange(min=0),
    help="GPUs the pool may use (default: those CUDA_VISIBLE_DEVICES or nvidia-smi shows).",
)
@click.option(
    "--run-config",
    "run_config",
    multiple=True,
    metavar='"K=V K2=V2"',
    help="Run-config overrides. An app directory accepts only the keys it declares, and "
    'keeps their types; values are TOML (3, 0.1, true, "text"). May be repeated.',
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    help="Seed for node ids and sampling (default: random, printed).",
)
@click.option(
    "--round-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="How long each phase of a round (training, then evaluation) waits for its "
    "replies, for strategies the ServerApp built without a round_timeout of their own "
    f"(default: theirs, {DEFAULT_ROUND_TIMEOUT:g} s). A ClientApp still running then is "
    "stopped, its reply counted as a failure, and the run goes on.",
)
@click.option(
    "--max-value-bytes",
    type=click.IntRange(min=1),
    metavar="BYTES",
    help="The most bytes one str or bytes value of a record may take (a model serialized "
    "into a ConfigRecord, say): a message holding a longer one is refused when pushed, a "
    "reply holding one becomes an error reply (code 2). Default: "
    f"{MAX_VALUE_LEN} (512 MiB, Flower's cap on a message).",
)
@click.option(
    "--metrics-out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Append to this file one JSON line for the run (run id, seed, config, start "
    "time, fedcore version), then one line of metrics per round.",
)
@results_dir_options()
@click.option(
    "--track",
    multiple=True,
    metavar="NAME[=WHERE]",
    help="Record the run's config and each round's metrics in an experiment tracker too, "
    "under the results directory's name: mlflow[=URI] (default: $MLFLOW_TRACKING_URI, else "
    "MLflow's default), tensorboard[=DIR] (default: the results directory's tensorboard/), "
    "wandb[=PROJECT] (default: $WANDB_PROJECT, else the app's name; WANDB_MODE=offline "
    "keeps the run on disk). Each needs its extra: pip install 'fedcore[NAME]'. May be "
    "repeated.",
)
@click.option(
    "--resume",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    metavar="DIR",
    help="Go on with the run whose results directory DIR is, from the last round it "
    "finished (its checkpoint), in DIR, with the app, nodes, seed and run config it "
    "started with; it ends with the model the whole run would have. TARGET may be left "
    "out (run.json names it).",
)
@click.option("--verbose", "-v", is_flag=True, help="Show debug logs.")
@click.option("--quiet", "-q", is_flag=True, help="Show only warnings, errors and the summary.")
def simulate(
    target: str | None,
    args: tuple[str, ...],
    module: str | None,
    nodes: int | None,
    federation: str | None,
    backend: str,
    ray_address: str | None,
    num_cpus: float | None,
    num_gpus: float | None,
    max_workers: int | None,
    system_cpus: float | None,
    system_gpus: float | None,
    run_config: tuple[str, ...],
    seed: int | None,
    round_timeout: float | None,
    max_value_bytes: int | None,
    metrics_out: Path | None,
    out: Path,
    no_save: bool,
    track: tuple[str, ...],
    resume: Path | None,
    verbose: bool,
    quiet: bool,
) -> None:
    """Simulate TARGET on --nodes virtual nodes on this machine.

    TARGET is an app directory whose pyproject.toml has a [tool.fedcore.app] table
    (server = "module:attr", client = "module:attr", and run-config defaults under
    [tool.fedcore.app.config]), a "module:attr" naming a fedcore.App importable
    from the current directory, or a Python script (.py: legacy Flower code that calls
    flwr.simulation.start_simulation or run_simulation). A Flower app directory works
    as it is: its [tool.flwr.app.components] and [tool.flwr.app.config] stand in for
    fedcore's tables, and its `import flwr...` statements get fedcore's names.

    A script runs as `python script.py ARGS` would (its directory first on sys.path),
    and -m MODULE as `python -m MODULE ARGS`, with `import flwr...` answered by fedcore;
    each simulation it starts runs here with --backend and the resource options, its
    node count and rounds its own. Put its ARGS after `--` when they look like
    fedcore's options. The process's exit status is the script's.

    \b
    Examples:
      fedcore simulate examples/quickstart-numpy --nodes 100 --seed 0
      fedcore simulate path/to/flower-app --federation local-sim-gpu
      fedcore simulate my_app:app -n 1000 --run-config "num-server-rounds=5 lr=0.05"
      fedcore simulate my_app:app -n 500 --num-gpus 0.25 --max-workers 8
      fedcore simulate examples/quickstart-numpy -n 100 --backend ray --ray-address HEAD:6379
      fedcore simulate examples/quickstart-numpy -n 100 --track tensorboard --track mlflow
      fedcore simulate --resume results/20261202T101500Z-quickstart-numpy-0
      fedcore simulate simulation.py -- --rounds 3
      fedcore simulate --backend inline -m baseline.main num_rounds=5 client.lr=0.05
    """
    from fedcore.simulation.progress import showing_progress, summary
    from fedcore.simulation.simulate import run_simulation

    if module is not None or _is_script(target):
        from fedcore.legacy.simulation import ScriptDefaults
        from fedcore.simulation import Resources

        if backend == "ray":
            raise click.BadParameter(
                "a script's simulations run on the process or inline backend",
                param_hint="--backend",
            )
        resources = None
        if num_cpus is not None or num_gpus is not None:
            resources = Resources(num_cpus or 1.0, num_gpus or 0.0)
        defaults = ScriptDefaults(
            backend=backend,
            resources=resources,
            system=_system(system_cpus, system_gpus),
            max_workers=max_workers,
            seed=seed,
            round_timeout=round_timeout,
            max_value_bytes=max_value_bytes,
            progress=False,  # _run_program's display shows every simulation's rounds
        )
        _run_program(target, args, module, defaults, verbose=verbose, quiet=quiet)
        return
    if args:
        unknown = next((arg for arg in args if arg.startswith("-") and arg != "-"), None)
        if unknown is not None:  # a mistyped option (only a program's arguments may be any)
            raise click.NoSuchOption(unknown.partition("=")[0])
        raise click.UsageError(
            f"unexpected arguments {' '.join(args)!r}: only a script (.py) or -m MODULE "
            "takes arguments"
        )
    keep: Path | None = None if no_save else out
    if resume is not None:
        target, keep = _resumed_target(resume, target, no_save), None
    elif target is None:
        raise click.UsageError("Missing argument 'TARGET' (or --resume DIR).")
    if nodes is not None and nodes < 1:
        raise click.BadParameter(f"must be at least 1, got {nodes}", param_hint="--nodes")
    if ray_address is not None and backend != "ray":
        raise click.BadParameter("is for --backend ray", param_hint="--ray-address")
    for text in run_config:
        try:
            parse_run_config(text)
        except RunConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--run-config") from None
    if metrics_out is not None and not metrics_out.parent.is_dir():
        raise click.BadParameter(
            f"cannot write {str(metrics_out)!r}: its directory does not exist",
            param_hint="--metrics-out",
        )
    show = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    live = sys.stderr.isatty() and not quiet
    with showing_progress(
        sys.stderr, show=show, live=live, verbose=verbose, metrics_out=metrics_out
    ) as display:
        started = time.monotonic()
        result: SimulationResult = run_simulation(
            target,
            nodes=nodes,
            backend=backend,
            ray_address=ray_address,
            resources=_resources(target, federation, num_cpus, num_gpus),
            federation=federation,
            system=_system(system_cpus, system_gpus),
            max_workers=max_workers,
            run_config=" ".join(run_config),
            seed=seed,
            round_timeout=round_timeout,
            max_value_bytes=max_value_bytes,
            progress=False,
            out=keep,
            track=track,
            resume=resume,
        )
    click.echo(summary(display.reports, time.monotonic() - started, result.seed))
    if result.out is not None:
        picture = result.out / "summary.png"
        shown = f" (picture: {picture})" if picture.exists() else ""
        click.echo(f"results: {result.out}{shown}", err=True)
    if display.reports and display.reports[-1].trained_nothing:
        raise click.ClickException(display.reports[-1].untrained_reason())


_NOT_FOR_PROGRAMS = {
    "nodes": "--nodes",
    "federation": "--federation",
    "ray_address": "--ray-address",
    "run_config": "--run-config",
    "metrics_out": "--metrics-out",
    "out": "--out",
    "track": "--track",
    "resume": "--resume",
}
"""Options of an app's run that a script's simulations do not take: the script itself says
how many nodes and rounds, and keeps its own results."""


def _is_script(target: str | None) -> bool:
    """Whether TARGET names a Python script (``.py``) rather than an app directory or a
    module:attr; one that does not exist is then the script's error, not the app's."""
    return target is not None and Path(target).suffix == ".py"


def _run_program(
    target: str | None,
    args: tuple[str, ...],
    module: str | None,
    defaults: ScriptDefaults,
    *,
    verbose: bool,
    quiet: bool,
) -> None:
    """Run a script, or a ``-m`` module, its simulations under ``defaults``; every one's
    rounds shown as an app's are."""
    from fedcore.legacy.script import run_module, run_script
    from fedcore.simulation.progress import showing_progress

    context = click.get_current_context()
    for name, flag in _NOT_FOR_PROGRAMS.items():
        if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError(
                f"{flag} is for an app directory; a script's simulations take their nodes "
                "and rounds from the script (put the script's own options after `--`)"
            )
    show = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    with showing_progress(sys.stderr, show=show, live=False, verbose=verbose):
        if module is not None:
            run_module(module, (*([] if target is None else [target]), *args), defaults)
        else:
            assert target is not None
            run_script(target, args, defaults)


def _resumed_target(resume: Path, target: str | None, no_save: bool) -> str:
    """The app a resumed run runs: TARGET, else the one its run.json names."""
    from fedcore.results.reading import read_run_file

    if no_save:
        raise click.BadParameter("a resumed run keeps its record in DIR", param_hint="--no-save")
    source = click.get_current_context().get_parameter_source("out")
    if source is click.core.ParameterSource.COMMANDLINE:
        raise click.BadParameter("a resumed run keeps its record in DIR", param_hint="--out")
    if target is not None:
        return target
    named = read_run_file(resume).get("target")
    if not isinstance(named, str):
        raise click.UsageError(
            f"{str(resume)!r}'s run.json does not name its app: give it as TARGET"
        )
    return named


def _resources(
    target: str, federation: str | None, num_cpus: float | None, num_gpus: float | None
) -> Resources | None:
    """The flags, each one not given taken from the app directory; ``None`` if neither
    was given (the simulation then takes both from the app)."""
    from fedcore.apps.project import SimulationDefaults, read_project
    from fedcore.simulation import Resources

    if num_cpus is None and num_gpus is None:
        return None
    path = Path(target)
    declared = (
        read_project(path, federation=federation).simulation
        if path.is_dir()
        else SimulationDefaults()
    )
    cpus = num_cpus if num_cpus is not None else declared.num_cpus
    gpus = num_gpus if num_gpus is not None else declared.num_gpus
    return Resources(1.0 if cpus is None else cpus, 0.0 if gpus is None else gpus)


def _system(cpus: float | None, gpus: float | None) -> Resources | None:
    """The machine's resources with the given overrides, or ``None`` to detect both."""
    from fedcore.simulation import Resources
    from fedcore.workers.sizing import detect_cpus, detect_gpus

    if cpus is None and gpus is None:
        return None
    return Resources(
        cpus if cpus is not None else float(detect_cpus()),
        gpus if gpus is not None else float(detect_gpus()),
    )
