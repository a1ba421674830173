"""The MLflow tracker (``--track mlflow[=URI]``, the ``[mlflow]`` extra: ``mlflow-skinny``).

It writes through an ``MlflowClient`` of its own, not MLflow's fluent API, so that a
simulation embedded in a script or notebook leaves the caller's active MLflow run
alone. Where: the URI given, else MLflow's choice — ``$MLFLOW_TRACKING_URI`` or
``mlflow.set_tracking_uri``, else its default (``sqlite:///mlflow.db`` here, which
needs the full ``mlflow`` package; ``mlflow ui`` in that directory shows it). A
directory named as the store (``--track mlflow=./mlruns``) is MLflow's file store,
which MLflow 3 refuses unless ``MLFLOW_ALLOW_FILE_STORE`` says yes: naming one is
taken as that yes (an explicit ``false`` is kept). A tracking server is asked for
first with a plain connection, so one that is not running is an error in seconds,
not after MLflow's minutes of retries. The
experiment is ``$MLFLOW_EXPERIMENT_NAME``, else the app's name; the run is named after
the results directory. Parameters: the run's description flattened (``app``,
``config.<key>``, ``seed``, ``backend``, ``nodes``, ``resources.num_cpus``, …);
tag ``fedcore.results``: the results directory. Each round's metrics are logged at
step = round, and the run ends ``FINISHED``, ``FAILED`` or ``KILLED``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from importlib.util import find_spec

import mlflow
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from fedcore.errors import TrackerError
from fedcore.results.trackers.base import TrackedRun, Tracker, flat_description

_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
"""The URI schemes of MLflow's SQLAlchemy stores (``mysql+pymysql://`` too), which
``mlflow-skinny`` lacks the packages for."""
_STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_PARAMS_BATCH, _METRICS_BATCH = 100, 1000
"""How many parameters, and metrics, MLflow takes in one batch at most."""
_PARAM_LENGTH = 6000
"""MLflow's longest parameter value."""


class MlflowTracker(Tracker):
    name = "mlflow"

    def start(self, run: TrackedRun) -> dict[str, str]:
        uri = self.where or mlflow.get_tracking_uri()
        scheme = urllib.parse.urlsplit(uri).scheme.split("+")[0]
        if scheme in _DATABASES and not find_spec("sqlalchemy"):
            raise TrackerError(
                f"the mlflow tracker cannot open {uri}: MLflow's database stores need the "
                "full package, pip install mlflow (fedcore[mlflow] has the client alone), or "
                "name another store: --track mlflow=./mlruns (a directory, MLflow's file "
                "store) or --track mlflow=http://HOST:PORT (a tracking server)"
            )
        if scheme in ("http", "https"):
            _check_listening(uri, scheme)
        with _file_store_allowed(scheme):
            return self._start(uri, run)

    def _start(self, uri: str, run: TrackedRun) -> dict[str, str]:
        self._client = MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or run.app
        tags = {"fedcore.app": run.app}
        if run.directory is not None:
            tags["fedcore.results"] = str(run.directory)
        created = self._client.create_run(
            self._experiment_id(experiment), run_name=run.name, tags=tags
        )
        self._run_id = created.info.run_id
        params = [
            Param(key, value[:_PARAM_LENGTH])
            for key, value in flat_description(run.description).items()
        ]
        for first in range(0, len(params), _PARAMS_BATCH):
            self._client.log_batch(self._run_id, params=params[first : first + _PARAMS_BATCH])
        return {"uri": uri, "experiment": experiment, "run_id": self._run_id}

    def log_round(self, step: int, metrics: Mapping[str, float], at: float) -> None:
        stamp = int(at * 1000)
        logged = [Metric(key, float(value), stamp, step) for key, value in metrics.items()]
        for first in range(0, len(logged), _METRICS_BATCH):
            self._client.log_batch(self._run_id, metrics=logged[first : first + _METRICS_BATCH])

    def finish(self, status: str, at: float) -> None:
        self._client.set_terminated(self._run_id, _STATUS[status], end_time=int(at * 1000))

    def _experiment_id(self, name: str) -> str:
        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self._client.create_experiment(name))
        except MlflowException:  # another run created it meanwhile
            found = self._client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)


_CONNECT_TIMEOUT = 5.0
"""Seconds a tracking server has to accept a connection before the run starts."""


def _check_listening(uri: str, scheme: str) -> None:
    """Refuse a tracking server that accepts no connection (unless a proxy reaches it)."""
    if scheme in urllib.request.getproxies():
        return
    parts = urllib.parse.urlsplit(uri)
    host = parts.hostname or "localhost"
    try:
        port = parts.port or (443 if scheme == "https" else 80)
        with socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT):
            pass
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise TrackerError(
            f"the mlflow tracker cannot reach {uri}: {reason} (is the tracking server "
            "running there? `mlflow server --port PORT` starts one)"
        ) from None


@contextlib.contextmanager
def _file_store_allowed(scheme: str) -> Iterator[None]:
    """MLflow's file store allowed while the client opens it, for a store named as a
    directory; MLflow keeps the store it opened, so later calls need nothing more."""
    if scheme not in ("", "file") or "MLFLOW_ALLOW_FILE_STORE" in os.environ:
        yield
        return
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)


TRACKER = MlflowTracker
