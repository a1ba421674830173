"""Run a Flower app directory on Flower's own simulation, as one command, in one process.

``.venv-flower/bin/python benchmarks/flower/simulate.py APP_DIR [--num-cpus 1]``: the
Flower side of ``make bench-flower``. It runs in an environment with Flower installed
(``flwr[simulation]``) and imports nothing of fedcore.

It reads the app's ``pyproject.toml`` as ``flwr run`` does — the ServerApp and ClientApp
of ``[tool.flwr.app.components]``, the run config of ``[tool.flwr.app.config]``, the
node count of the default ``[tool.flwr.federations]`` entry — and hands them to
``flwr.simulation.run_simulation``, Flower's in-process entry to the same simulation
engine and Ray backend that ``flwr run`` reaches through a local SuperLink. No
SuperLink, no app bundle and no fixed ports: two of these can run side by side, and
nothing outlives the command. ``--num-cpus`` sets the ClientApps' ``client_resources``;
without it Flower's defaults apply (in 1.42: 2 CPUs, 0 GPUs each).

``run_simulation`` gives the ServerApp an empty run config, so a ServerApp lifespan
registered here fills it from the app's table (and ``--run-config`` overrides) before
``main`` runs; the benchmark apps pass what their ClientApps need in each round's
config record.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _attribute(reference: str) -> Any:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def _overrides(pairs: list[str]) -> dict[str, Any]:
    """``K=V`` pairs whose values are TOML, as ``flwr run --run-config`` takes them."""
    return tomllib.loads("\n".join(pairs)) if pairs else {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app", type=Path, help="a Flower app directory")
    parser.add_argument("--num-cpus", type=float, help="client_resources num_cpus")
    parser.add_argument("--nodes", type=int, help="num_supernodes (default: the federation's)")
    parser.add_argument("--run-config", action="append", default=[], metavar="K=V")
    args = parser.parse_args(argv)

    project = tomllib.loads((args.app / "pyproject.toml").read_text())["tool"]["flwr"]
    run_config = dict(project["app"].get("config", {})) | _overrides(args.run_config)
    federations = project["federations"]
    nodes = args.nodes or federations[federations["default"]]["options"]["num-supernodes"]

    sys.path.insert(0, str(args.app.resolve()))
    components = project["app"]["components"]
    server_app = _attribute(components["serverapp"])
    client_app = _attribute(components["clientapp"])

    @server_app.lifespan()
    def fill_run_config(context: Any) -> Iterator[None]:
        context.run_config.update(run_config)
        yield

    from flwr.simulation import run_simulation

    backend_config: dict[str, Any] = {}
    if args.num_cpus is not None:
        backend_config["client_resources"] = {"num_cpus": args.num_cpus, "num_gpus": 0.0}
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=nodes,
        backend_config=backend_config or None,
    )


if __name__ == "__main__":
    main()
