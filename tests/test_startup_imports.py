"""What each ``fedcore`` command imports, run as a user runs it: a command loads only what it needs.

Start-up time is a benchmark (``python -m benchmarks.run startup help``); this holds
the structure behind it. Each case runs the console script with a ``sitecustomize``
on ``PYTHONPATH`` that, as each process exits, writes the names in its
``sys.modules`` to a file of its own: the command's, and those of the process
backend's workers, which inherit the environment.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from fedcore.cli import COMMANDS, cli
from fedcore.testing.deployment import FEDCORE
from fedcore.testing.network import closed_port

OBSERVER = """\
import atexit, os, sys

def _write():
    path = os.path.join(os.environ["STARTUP_IMPORTS_DIR"], str(os.getpid()))
    with open(path, "w") as out:
        out.write("\\n".join(sorted(sys.modules)))

atexit.register(_write)
"""
DEPLOYMENT = ("grpclib", "betterproto", "aiohttp")
DEPLOYMENT_CODE = (
    "fedcore.roles",
    "fedcore.runtime",
    "fedcore.transport.grpc",
    "fedcore.transport.http",
    "fedcore.wire.fleet",
    "fedcore.wire._pb",
)
TINY_APP = """\
import fedcore as fc

client = fc.ClientApp()


@client.train()
def train(msg, context):
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord({"n": 1})}), reply_to=msg)


server = fc.ServerApp()


@server.main()
async def main(grid, context):
    nodes = await grid.get_node_ids()
    replies = await grid.send_and_receive([fc.Message(fc.RecordDict(), n, "train") for n in nodes])
    assert len(replies) == len(nodes) and all(reply.has_content() for reply in replies)
    print("replies:", len(replies))


app = fc.App(server=server, client=client)
"""


@dataclass
class Ran:
    """A command's stdout, and the modules each of its processes had imported at exit."""

    out: str
    processes: list[set[str]]

    @property
    def modules(self) -> set[str]:
        return set().union(*self.processes)


def ran(tmp_path: Path, *args: str, cwd: Path | None = None, expect: int = 0) -> Ran:
    """Run ``fedcore ARGS`` as a user would, watched by :data:`OBSERVER`."""
    observer, seen = tmp_path / "observer", tmp_path / "seen"
    observer.mkdir()
    seen.mkdir()
    (observer / "sitecustomize.py").write_text(OBSERVER)
    path = os.pathsep.join(filter(None, [str(observer), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": path, "STARTUP_IMPORTS_DIR": str(seen)}
    done = subprocess.run(
        [str(FEDCORE), *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == expect, done.stderr[-2000:]
    processes = [set(file.read_text().split()) for file in sorted(seen.iterdir())]
    assert processes, "no process wrote its modules: the observer did not run"
    return Ran(done.stdout, processes)


def offending(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    """The modules that are, or are inside, one of ``forbidden``."""
    return sorted({m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden)})


def test_help_imports_no_deployment_stack_and_no_numpy(tmp_path: Path) -> None:
    done = ran(tmp_path, "--help")
    assert "simulate" in done.out
    assert "serve" in done.out
    forbidden = (*DEPLOYMENT, "numpy", "fedcore.simulation", *DEPLOYMENT_CODE)
    assert offending(done.modules, forbidden) == []


@pytest.mark.parametrize("command", ["run", "ls", "log", "stop"])
def test_a_control_command_s_help_imports_no_client_and_no_numpy(
    tmp_path: Path, command: str
) -> None:
    done = ran(tmp_path, command, "--help")
    assert "--link" in done.out
    # It may parse --link (fedcore.runtime.addresses), but load no client and no codec.
    forbidden = (*DEPLOYMENT, "numpy", "fedcore.transport", "fedcore.roles", "fedcore.wire")
    assert offending(done.modules, forbidden) == []


def test_serve_help_imports_no_runtime_and_no_numpy(tmp_path: Path) -> None:
    done = ran(tmp_path, "serve", "--help")
    assert "--heartbeat-patience" in done.out
    forbidden = (*DEPLOYMENT, "numpy", *DEPLOYMENT_CODE, "fedcore.runtime", "fedcore.state")
    assert offending(done.modules, forbidden) == []


def test_simulate_help_imports_no_simulation_and_no_numpy(tmp_path: Path) -> None:
    done = ran(tmp_path, "simulate", "--help")
    assert "--round-timeout" in done.out
    forbidden = (*DEPLOYMENT, "numpy", "ray", "fedcore.simulation", "fedcore.strategy")
    assert offending(done.modules, forbidden) == []


def test_ls_imports_the_http_client_but_no_grpc_nor_protobuf(tmp_path: Path) -> None:
    done = ran(tmp_path, "ls", "--link", f"127.0.0.1:{closed_port()}", expect=1)
    assert "fedcore.transport.http.control" in done.modules  # it did reach for the link
    forbidden = ("grpclib", "betterproto", "fedcore.roles", "fedcore.transport.grpc")
    assert offending(done.modules, (*forbidden, "fedcore.wire.fleet", "fedcore.wire._pb")) == []


def test_simulate_and_its_workers_import_no_deployment_code(tmp_path: Path) -> None:
    (tmp_path / "startup_tiny_app.py").write_text(TINY_APP)
    done = ran(
        tmp_path, "simulate", "startup_tiny_app:app", "--nodes", "3", "--backend", "process",
        "--max-workers", "2", "--seed", "0", "--quiet", cwd=tmp_path,
    )  # fmt: skip
    assert "replies: 3" in done.out
    workers = [p for p in done.processes if "fedcore.cli" not in p]
    assert len(workers) == 2, "expected the simulation's own process and its 2 workers"
    assert all("startup_tiny_app" in worker for worker in workers)
    # Ray is the ray backend's alone, each tracker's library its own (--track), and
    # dp-accounting the privacy accountant's: installed or not, nothing else imports them.
    trackers = ("mlflow", "tensorboard", "wandb", "fedcore.results.trackers.mlflow")
    trackers += ("fedcore.results.trackers.tensorboard", "fedcore.results.trackers.wandb")
    accounting = ("dp_accounting", "fedcore.privacy_accounting")
    assert (
        offending(done.modules, (*DEPLOYMENT, *DEPLOYMENT_CODE, "ray", *trackers, *accounting))
        == []
    )
    # A worker loads its ClientApp, not the engine that drives it.
    engine = ("fedcore.simulation.engine", "fedcore.simulation.simulate", "fedcore.state")
    engine += ("fedcore.workers.pool", "fedcore.simulation.progress")
    assert [offending(worker, engine) for worker in workers] == [[], []]


def test_the_listing_says_what_each_command_s_own_help_says() -> None:
    """``fedcore --help`` lists the commands from a table: it must not drift from them."""
    context = click.Context(cli, info_name="fedcore")
    for name, (_, summary) in COMMANDS.items():
        command = cli.get_command(context, name)
        assert command is not None
        assert command.name == name
        assert (command.help or "").split("\n\n")[0].replace("\n", " ") == summary
    lazy, eager = click.HelpFormatter(), click.HelpFormatter()
    cli.format_commands(context, lazy)
    click.Group.format_commands(cli, context, eager)  # click's own, from the commands
    assert lazy.getvalue() == eager.getvalue()
