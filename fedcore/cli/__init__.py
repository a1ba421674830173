"""The ``fedcore`` command: parse flags, call the runtime, print outcomes. No logic lives here.

Errors a person can fix (a bad flag, a target that does not load, an undeclared
run-config key) end the command with one line and exit status 2; an exception
raised by the app's own code is shown with its traceback, since that is the
app author's to read.

Each command's module is imported only when that command runs (or shows its
help): ``fedcore ls`` has no use for the gRPC stack ``fedcore serve`` needs, nor
``fedcore simulate`` for either, and ``fedcore --help`` for anything at all.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from fedcore import __version__
from fedcore.cli.tracebacks import app_traceback
from fedcore.errors import FedcoreError, UsageError

COMMANDS: dict[str, tuple[str, str]] = {
    "keygen": (
        "fedcore.cli.keygen:keygen",
        "Write a new node key pair: OUT.key (mode 0600) and OUT.pub.",
    ),
    "log": ("fedcore.cli.runs:log", "Print a run's ServerApp log."),
    "new": (
        "fedcore.cli.new:new",
        "Write a new app directory, NAME, that `fedcore simulate NAME` runs as it is.",
    ),
    "nodes": (
        "fedcore.cli.nodes:nodes",
        "List, add or remove the public keys of the nodes the link admits.",
    ),
    "ls": ("fedcore.cli.runs:ls", "List the link's runs (newest last), or its online nodes."),
    "pull": (
        "fedcore.cli.record:pull",
        "Write a run's record on the link into DIRECTORY, as a results directory.",
    ),
    "plot": (
        "fedcore.cli.plot:plot",
        "Draw each metric of the RUNS (results directories) over rounds, on one figure.",
    ),
    "run": (
        "fedcore.cli.runs:run",
        "Pack APP_DIR (default: here), submit it to the link as a new run, print its id.",
    ),
    "serve": ("fedcore.cli.serve:serve", "Serve a role until interrupted."),
    "simulate": (
        "fedcore.cli.simulate:simulate",
        "Simulate TARGET on --nodes virtual nodes on this machine.",
    ),
    "ui": (
        "fedcore.cli.runs:ui",
        "Print the address of the link's page, its control token in the fragment.",
    ),
    "stop": (
        "fedcore.cli.runs:stop",
        "Stop a run: its ServerApp is ended and its messages are no longer delivered.",
    ),
}
"""Each command: where it is defined (``module:attribute``), and the first paragraph of its
help, which ``fedcore --help`` lists without importing the module (a test holds the two
to the command's own docstring)."""


class _Commands(click.Group):
    """A group that imports a command's module the first time the command is asked for.

    Commands added the usual way (``cli.add_command``) are listed and found as well.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = COMMANDS[cmd_name][0].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The listing click would print, from :data:`COMMANDS` instead of the commands."""
        listed = {
            name: click.Command(name, help=summary) for name, (_, summary) in COMMANDS.items()
        }
        click.Group(commands={**listed, **self.commands}).format_commands(ctx, formatter)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fedcore")
def cli() -> None:
    """fedcore: federated learning, simulated on one machine or deployed across many."""


# click >= 8.2 raises this usage error to show a group's help when it gets no arguments.
_NO_ARGS_IS_HELP: type[click.UsageError] | tuple[()] = getattr(
    click.exceptions, "NoArgsIsHelpError", ()
)


def main() -> None:
    """The console script's entry point."""
    try:
        _main()
    except SystemExit as exc:
        _leave(exc)
        raise
    _leave(SystemExit(0))


def _leave(ending: SystemExit) -> None:
    """End the process at once, with ``ending``'s status, if plain ClientApp handlers still
    run in this process (an inline simulation that ended with them in flight).

    The interpreter's own exit would end their daemon threads with ``pthread_exit`` as
    they next take the GIL; one inside a C++ library (torch) then aborts the whole
    process (``terminate called without an active exception``, status 134). Nothing is
    left to do by then but to flush what was written.
    """
    threads = sys.modules.get("fedcore.apps.handler_threads")
    if threads is None or not threads.handlers_running():
        return
    code = ending.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def _main() -> None:
    try:
        cli.main(prog_name="fedcore", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except _NO_ARGS_IS_HELP as exc:  # `fedcore` alone: the help text, as is
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        click.echo(f"error: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except UsageError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except FedcoreError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        click.echo(app_traceback(exc), err=True, nl=False)
        sys.exit(1)
