"""Flower's ``flwr.simulation.start_simulation`` and ``run_simulation``, on fedcore's engine.

A legacy script builds its federation in Python and calls one of these two; both run
here, in this process, on fedcore's simulation engine (:mod:`fedcore.simulation.simulate`)
with its default backend, or the one ``fedcore simulate script.py --backend ...`` chose
(:func:`script_defaults`). Ray's own options (``ray_init_args``, ``actor_type`` and the
rest) mean nothing here: they are accepted, and one log line says they were ignored.

A script's ``client_fn`` lives in its ``__main__``, often a closure over the data it
loaded (``generate_client_fn(trainloaders, ...)``), which a process-pool worker cannot
import by name. So for the process backend the ClientApp is shipped by value: pickled
with cloudpickle into a file that every worker of the run unpickles, found through
:data:`SHIPPED_CLIENT_ENV`, as the ClientApp of :data:`RUNNING_APP`. A client_fn must
therefore pickle: what it closes over (arrays, datasets, models) may be anything
picklable, but not a lock, an open file or a database connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedcore.apps.app import App
from fedcore.apps.client_app import ClientApp
from fedcore.apps.server_app import ServerApp
from fedcore.errors import AppLoadError, UsageError
from fedcore.simulation.resources import Resources

if TYPE_CHECKING:
    from fedcore.legacy.client_manager import ClientManager
    from fedcore.legacy.history import History
    from fedcore.legacy.server import Server
    from fedcore.legacy.server_config import ServerConfig
    from fedcore.legacy.strategy import Strategy

log = logging.getLogger(__name__)

SHIPPED_CLIENT_ENV = "FEDCORE_SHIPPED_CLIENT_APP"
"""The file holding the running simulation's pickled ClientApp, for its workers."""
RUNNING_APP = f"{__name__}:running_app"
"""What the engine loads a script's simulation from: :func:`__getattr__` answers it."""


@dataclass(frozen=True)
class ScriptDefaults:
    """What ``fedcore simulate script.py`` sets for every simulation the script starts.

    ``resources``, when given, overrides what the script asks for (``client_resources``).
    """

    backend: str | None = None
    resources: Resources | None = None
    system: Resources | None = None
    max_workers: int | None = None
    seed: int | None = None
    round_timeout: float | None = None
    max_value_bytes: int | None = None
    progress: bool = True


_defaults = ScriptDefaults()
_running: App | None = None


@contextlib.contextmanager
def script_defaults(defaults: ScriptDefaults) -> Iterator[None]:
    """Run the simulations started inside the block with ``defaults``."""
    global _defaults
    previous, _defaults = _defaults, defaults
    try:
        yield
    finally:
        _defaults = previous


def start_simulation(
    *,
    client_fn: Callable[..., Any],
    num_clients: int,
    clients_ids: list[str] | None = None,
    client_resources: Mapping[str, float] | None = None,
    server: Server | None = None,
    config: ServerConfig | None = None,
    strategy: Strategy | None = None,
    client_manager: ClientManager | None = None,
    ray_init_args: Mapping[str, Any] | None = None,
    keep_initialised: bool | None = False,
    actor_type: object = None,
    actor_kwargs: Mapping[str, Any] | None = None,
    actor_scheduling: object = "DEFAULT",
) -> History:
    """Run ``num_clients`` virtual clients made by ``client_fn`` against a legacy server,
    and return its :class:`~fedcore.legacy.history.History`, as Flower's does.

    ``server``/``config``/``strategy``/``client_manager`` are what a legacy
    ``ServerApp(server_fn=...)`` returns in its ``ServerAppComponents``, with Flower's
    defaults (a FedAvg, one round). Client ``i`` gets ``partition-id`` ``i`` and
    ``num-partitions`` ``num_clients`` in its node config.
    """
    from fedcore.legacy.client_app import ClientApp as LegacyClientApp
    from fedcore.legacy.history import History
    from fedcore.legacy.server_app import ServerApp as LegacyServerApp
    from fedcore.legacy.server_config import ServerAppComponents

    if clients_ids is not None:
        raise UsageError(
            "start_simulation(clients_ids=...) is no longer supported (as in Flower); "
            "pass num_clients"
        )
    resources, custom = _resources(client_resources)
    _ignored(
        "start_simulation",
        ray_init_args=ray_init_args is not None,
        keep_initialised=bool(keep_initialised),
        actor_type=actor_type is not None,
        actor_kwargs=actor_kwargs is not None,
        actor_scheduling=actor_scheduling != "DEFAULT",
        **{f"client_resources[{key!r}]": True for key in custom},
    )
    components = ServerAppComponents(
        server=server, config=config, strategy=strategy, client_manager=client_manager
    )
    app = App(
        server=LegacyServerApp(server_fn=lambda _context: components),
        client=LegacyClientApp(client_fn=client_fn),
    )
    value = _simulate(app, num_clients, resources)
    if not isinstance(value, History):
        raise TypeError(f"the legacy server returned {type(value).__name__}, not a History")
    return value


def run_simulation(
    server_app: ServerApp,
    client_app: ClientApp,
    num_supernodes: int,
    backend_name: str = "ray",
    backend_config: Mapping[str, Any] | None = None,
    enable_tf_gpu_growth: bool = False,
    verbose_logging: bool = False,
) -> None:
    """Run ``server_app`` against ``num_supernodes`` nodes running ``client_app``.

    ``backend_config["client_resources"]`` sizes the workers; its other keys (Ray's
    ``init_args``, ``actor``), ``backend_name`` and ``enable_tf_gpu_growth`` are
    Ray's and ignored, as is ``verbose_logging`` (``fedcore simulate -v`` shows
    fedcore's debug records).
    """
    if not isinstance(server_app, ServerApp):
        raise TypeError(f"server_app must be a ServerApp, got {type(server_app).__name__}")
    if not isinstance(client_app, ClientApp):
        raise TypeError(f"client_app must be a ClientApp, got {type(client_app).__name__}")
    backend_config = dict(backend_config or {})
    resources, custom = _resources(backend_config.pop("client_resources", None))
    _ignored(
        "run_simulation",
        backend_name=backend_name != "ray",
        enable_tf_gpu_growth=enable_tf_gpu_growth,
        verbose_logging=verbose_logging,
        **{f"backend_config[{key!r}]": True for key in backend_config},
        **{f"client_resources[{key!r}]": True for key in custom},
    )
    _simulate(App(server=server_app, client=client_app), num_supernodes, resources)


def _ignored(function: str, **given: bool) -> None:
    """One log line naming the arguments of Flower's Ray runtime the script gave, if any."""
    names = [name for name, was_given in given.items() if was_given]
    if names:
        log.info("%s() ignored %s: fedcore runs without Ray", function, ", ".join(names))


def _resources(client_resources: Mapping[str, float] | None) -> tuple[Resources, list[str]]:
    """A client's resources: the command line's, else the script's (Flower's defaults,
    1 CPU and no GPU, for what it leaves out); and the keys of Ray's custom resources
    given, which mean nothing here."""
    given = dict(client_resources or {})
    custom = sorted(set(given) - {"num_cpus", "num_gpus"})
    if _defaults.resources is not None:
        return _defaults.resources, custom
    try:
        resources = Resources(
            num_cpus=given.get("num_cpus", 1.0), num_gpus=given.get("num_gpus", 0.0)
        )
    except ValueError as exc:
        raise UsageError(f"client_resources: {exc}") from None
    return resources, custom


def _simulate(app: App, nodes: int, resources: Resources) -> Any:
    """Run ``app`` on ``nodes`` nodes with the script's defaults; return main's value."""
    global _running
    from fedcore.simulation.simulate import run_simulation as run

    defaults = _defaults  # as the command line set them when the script started
    options: dict[str, Any] = {
        "nodes": nodes,
        "resources": resources,
        "system": defaults.system,
        "max_workers": defaults.max_workers,
        "seed": defaults.seed,
        "round_timeout": defaults.round_timeout,
        "max_value_bytes": defaults.max_value_bytes,
        "progress": defaults.progress,
    }
    if defaults.backend is not None:
        options["backend"] = defaults.backend
    if defaults.backend == "inline":
        return run(app, **options).value
    with tempfile.TemporaryDirectory(prefix="fedcore-script-") as directory:
        shipped = Path(directory) / "client_app.pickle"
        shipped.write_bytes(_pickled(app.client))
        previous_env = os.environ.get(SHIPPED_CLIENT_ENV)
        previous_app, _running = _running, app
        os.environ[SHIPPED_CLIENT_ENV] = str(shipped)
        try:
            return run(RUNNING_APP, **options).value
        finally:
            _running = previous_app
            if previous_env is None:
                del os.environ[SHIPPED_CLIENT_ENV]
            else:
                os.environ[SHIPPED_CLIENT_ENV] = previous_env


def _pickled(client: ClientApp) -> bytes:
    """``client`` by value, functions and classes of ``__main__`` included."""
    import cloudpickle

    try:
        return bytes(cloudpickle.dumps(client))
    except Exception as exc:
        raise UsageError(
            "the ClientApp (its client_fn, and what that closes over) cannot be pickled for "
            f"the process backend's workers: {type(exc).__name__}: {exc}; make it picklable, "
            "or run on the inline backend (fedcore simulate --backend inline)"
        ) from exc


def __getattr__(name: str) -> App:
    """``running_app``: the App of the script's simulation now running.

    In the engine's process it is the App ``start_simulation`` built; in a worker, an
    App with that ClientApp, unpickled from :data:`SHIPPED_CLIENT_ENV`'s file (and an
    empty ServerApp: workers run no server).
    """
    if name != "running_app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _running is not None:
        return _running
    path = os.environ.get(SHIPPED_CLIENT_ENV)
    if not path:
        raise AppLoadError(f"no script's simulation is running ({SHIPPED_CLIENT_ENV} is unset)")
    try:
        client = pickle.loads(Path(path).read_bytes())
    except Exception as exc:
        raise AppLoadError(
            f"cannot unpickle the script's ClientApp: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(client, ClientApp):
        raise AppLoadError(f"the script's shipped ClientApp is a {type(client).__name__}")
    return App(server=ServerApp(), client=client)
