"""The ``fedcore`` command: parse flags, call the runtime, print outcomes. No logic lives here.

Errors a person can fix (a bad flag, a target that does not load, an undeclared
run-config key) end the command with one line and exit status 2; an exception
raised by the app's own code is shown with its traceback, since that is the
app author's to read.
"""

from __future__ import annotations

import sys

import click

from fedcore import __version__
from fedcore.cli.runs import log, ls, run, stop
from fedcore.cli.serve import serve
from fedcore.cli.simulate import simulate
from fedcore.cli.tracebacks import app_traceback
from fedcore.errors import FedcoreError, UsageError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fedcore")
def cli() -> None:
    """fedcore: federated learning, simulated on one machine or deployed across many."""


for command in (simulate, serve, run, ls, log, stop):
    cli.add_command(command)

# click >= 8.2 raises this usage error to show a group's help when it gets no arguments.
_NO_ARGS_IS_HELP: type[click.UsageError] | tuple[()] = getattr(
    click.exceptions, "NoArgsIsHelpError", ()
)


def main() -> None:
    """The console script's entry point."""
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
