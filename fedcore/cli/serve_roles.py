"""``fedcore serve --role link|node|exec``: one small command per role.

Each takes its role's options (:mod:`fedcore.cli.serve_options`), hands them to the
runtime as the role's flags, which check them, and serves the role
(:func:`fedcore.runtime.serve.serve`). The runtime is imported when a role runs, not
here: ``--help`` needs none of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from fedcore.cli.serve_options import options_of
from fedcore.errors import UsageError

if TYPE_CHECKING:
    from fedcore.runtime.serve import RoleFlags

EVERY_ROLE = """Every file the role writes is readable by its user only (mode 0600,
directories 0700), whatever the umask, and no process of its user but root may
read its memory (nor that of the app processes it starts). App processes run as
the role's user unless --app-user names another."""

ROLE_HELP = {
    "link": "the hub. Nodes connect to its fleet API; `fedcore run` submits runs to its "
    "control API; it launches each run's ServerApp process (its exec role), unless "
    "--no-local-exec leaves that to external execs.",
    "node": "one device or data silo. Connects out to the link, runs ClientApps in a "
    "process per run (its exec role; or its own exec's, --exec-socket), and needs no "
    "inbound port.",
    "exec": "launches the ServerApps of a link's runs (--link-exec), or the ClientApps of "
    "a node (--exec-socket), in a process of its own (process isolation); needs "
    "--exec-secret-file.",
}
"""What each role is, as ``fedcore serve --help`` and the role's own help say."""


def _serve(flags: Callable[..., RoleFlags], given: dict[str, Any]) -> None:
    from fedcore.runtime.serve import serve

    try:
        checked = flags(**given)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    serve(checked)


def _link(**given: Any) -> None:
    from fedcore.runtime.serve import LinkFlags

    _serve(LinkFlags, given)


def _node(**given: Any) -> None:
    from fedcore.runtime.serve import NodeFlags

    _serve(NodeFlags, given)


def _exec(**given: Any) -> None:
    from fedcore.runtime.serve import ExecFlags

    _serve(ExecFlags, given)


def _command(role: str, callback: Callable[..., None]) -> click.Command:
    return click.Command(
        f"serve --role {role}",
        params=list(options_of(role)),
        callback=callback,
        help=f"Serve a {role} until interrupted.\n\nThe {role}: {ROLE_HELP[role]}\n\n{EVERY_ROLE}",
    )


ROLE_COMMANDS = {
    "link": _command("link", _link),
    "node": _command("node", _node),
    "exec": _command("exec", _exec),
}
"""Each role's command, by the name ``--role`` gives it."""
