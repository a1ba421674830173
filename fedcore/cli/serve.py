"""``fedcore serve --role link|node|exec``: run a long-lived role until Ctrl-C or SIGTERM.

A dispatcher: ``--role`` picks the role's own command (:mod:`fedcore.cli.serve_roles`),
which parses the rest of the line. ``fedcore serve --help`` lists every role's options;
``fedcore serve --role ROLE --help`` those of one.
"""

from __future__ import annotations

import textwrap

import click

from fedcore.cli.serve_options import OPTIONS, ROLES
from fedcore.cli.serve_roles import EVERY_ROLE, ROLE_COMMANDS, ROLE_HELP

_ROLE = click.Option(["--role"], type=click.Choice(ROLES), help="Which role to serve.")


class _Dispatcher(click.Command):
    """``serve``: takes ``--role`` and leaves everything else to that role's command."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Every role's options, each once, tagged with the roles that take it."""
        params: list[click.Parameter] = [_ROLE, *(option for _, option in OPTIONS)]
        records = [record for param in params if (record := param.get_help_record(ctx))]
        records.append((", ".join(ctx.help_option_names), "Show this message and exit."))
        with formatter.section("Options"):
            formatter.write_dl(records)


def _dispatch(role: str | None) -> None:
    ctx = click.get_current_context()
    if role is None:
        if set(ctx.args) & set(ctx.help_option_names):
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit()
        raise click.MissingParameter(ctx=ctx, param=_ROLE)
    command = ROLE_COMMANDS[role]
    # The role's command stands where `serve` stands, so its usage line and its errors
    # read `fedcore serve --role ROLE`.
    with command.make_context(command.name, list(ctx.args), parent=ctx.parent) as role_ctx:
        command.invoke(role_ctx)


serve = _Dispatcher(
    "serve",
    params=[_ROLE],
    callback=_dispatch,
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    help="Serve a role until interrupted.\n\n\b\n"
    + "\n".join(
        "\n".join(
            textwrap.wrap(
                ROLE_HELP[role], 78, initial_indent=f"{role}: ", subsequent_indent="      "
            )
        )
        for role in ROLES
    )
    + f"\n\n{EVERY_ROLE}",
)
