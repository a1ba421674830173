"""How ``fedcore run / ls / log / stop / pull / nodes / ui`` reach a link's control API.

The options every such command shares (``--link``, ``--token-file``,
``--root-certificates``, ``--insecure``, ``--json``), gathered into one
:class:`Connection`, and :func:`call_control`, which does a command's work with the
link's control API and turns its refusals into one line for a person. The link's bearer
token is found as :mod:`fedcore.auth.control_token` says; plaintext to a link on
another machine takes ``--insecure``, as it does for ``fedcore serve``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import click

from fedcore.auth.control_token import TOKEN_ENV, client_token
from fedcore.errors import AuthenticationError, WrongServiceError
from fedcore.runtime.addresses import Address, parse_address

if TYPE_CHECKING:
    import ssl

    from fedcore.domain.run import Run
    from fedcore.runtime.control_client import ControlService

T = TypeVar("T")

LINK_ENV = "FEDCORE_LINK"
link_option = click.option(
    "--link",
    "link",
    default=lambda: os.environ.get(LINK_ENV, "127.0.0.1:9093"),
    show_default="127.0.0.1:9093, or $FEDCORE_LINK",
    help="The link's control API address, HOST:PORT.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
_CONNECTION_OPTIONS = (
    link_option,
    click.option(
        "--token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help=f"The file holding the link's control token (the link's <work dir>/control.token "
        f"or its --control-token-file). Default: ${TOKEN_ENV}, else, for a link on loopback, "
        ".fedcore-link/control.token here (a link started here with the default work dir).",
    ),
    click.option(
        "--root-certificates",
        type=click.Path(dir_okay=False, path_type=Path),
        help="CA certificates to verify the link's control API with: talk HTTPS (the link's "
        "--control-ssl-certfile).",
    ),
    click.option(
        "--insecure",
        is_flag=True,
        help="Talk plaintext to a link on another machine (its token crosses the network "
        "in the clear).",
    ),
)


@dataclass(frozen=True)
class Connection:
    """Where a command finds the link's control API, and how it talks to it."""

    link: str
    token_file: Path | None
    root_certificates: Path | None
    insecure: bool


def connection_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` the options of :data:`_CONNECTION_OPTIONS`, as one ``connection``."""

    @functools.wraps(command)
    def with_connection(
        *args: Any,
        link: str,
        token_file: Path | None,
        root_certificates: Path | None,
        insecure: bool,
        **kwargs: Any,
    ) -> None:
        command(
            *args, connection=Connection(link, token_file, root_certificates, insecure), **kwargs
        )

    decorated = with_connection
    for option in reversed(_CONNECTION_OPTIONS):
        decorated = option(decorated)
    return decorated


def control_tls(address: Address, connection: Connection) -> ssl.SSLContext | None:
    """HTTPS trusting ``--root-certificates``; plaintext only on loopback or ``--insecure``."""
    if connection.root_certificates is not None:
        from fedcore.runtime.tls import client_context

        return client_context(connection.root_certificates)
    if not connection.insecure and not address.is_loopback:
        raise click.UsageError(
            f"the link at {address} is on another machine: give --root-certificates (the "
            "control API over TLS), or --insecure to send its token in plaintext"
        )
    return None


def call_control(connection: Connection, work: Callable[[ControlService], Awaitable[T]]) -> T:
    """``work`` done with the control API of the link ``connection`` names, in one line
    of error for a person when the link refuses it."""
    address = parse_address(connection.link, what="--link")
    tls = control_tls(address, connection)
    token = client_token(connection.token_file, link=address)

    # Imported here, not at the top: the HTTP client is most of this module's import
    # time, and `--help` has no use for it.
    from fedcore.runtime.control_client import open_control

    async def main() -> T:
        async with open_control(address, tls, token.token) as control:
            return await work(control)

    try:
        return anyio.run(main)
    except WrongServiceError as exc:  # the likeliest slip: another of the link's ports
        raise WrongServiceError(
            f"{exc}; the link's control API is on --control-address, default 127.0.0.1:9093"
        ) from None
    except AuthenticationError as exc:
        raise AuthenticationError(f"{exc}; {token.hint}") from None


def run_json(run: Run) -> dict[str, Any]:
    """A run as ``--json`` prints it (the id as a string: 63-bit ids exceed JSON's doubles)."""
    return {
        "run_id": str(run.run_id),
        "status": str(run.status),
        "reason": run.reason,
        "created_at": run.created_at,
        "bundle_hash": run.bundle_hash,
        "run_config": run.run_config,
    }
