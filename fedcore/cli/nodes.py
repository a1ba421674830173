"""``fedcore nodes``: the link's list of authorized nodes, edited over its control API."""

from __future__ import annotations

from pathlib import Path

import click

from fedcore.cli.control import Connection, call_control, connection_options


def _key_text(key: str) -> str:
    """``KEY``: a file holding a public key (``OUT.pub`` of ``fedcore keygen``), or the key."""
    path = Path(key)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise click.UsageError(f"cannot read {path}: {exc}") from None
    return key


def _echo(keys: list[str]) -> None:
    for key in keys:
        click.echo(key)


@click.group()
def nodes() -> None:
    """List, add or remove the public keys of the nodes the link admits.

    The link must have been started with --authorized-nodes FILE: a change rewrites
    that file and takes effect at once (a node unlisted is refused from its next
    request). Each prints the list after it.
    """


@nodes.command("list")
@connection_options
def list_keys(connection: Connection) -> None:
    """Print the authorized public keys, one per line."""
    _echo(call_control(connection, lambda control: control.authorized_nodes()))


@nodes.command()
@click.argument("key")
@connection_options
def add(key: str, connection: Connection) -> None:
    """Admit the node of KEY: a .pub file, or the key's one-line OpenSSH form."""
    text = _key_text(key)
    _echo(call_control(connection, lambda control: control.authorize_node(text)))


@nodes.command()
@click.argument("key")
@connection_options
def remove(key: str, connection: Connection) -> None:
    """Refuse the node of KEY (a .pub file, or the key) from its next request on."""
    text = _key_text(key)
    _echo(call_control(connection, lambda control: control.deauthorize_node(text)))
