"""``fedcore keygen``: a node key pair for ``fedcore serve --role node --auth-key``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import click

if TYPE_CHECKING:
    from fedcore.auth.keys import KeyKind

KINDS = ("ed25519", "p256", "p384")
"""``fedcore.auth.keys.KEY_KINDS``, written out so that ``--help`` loads no cryptography
(a test holds the two together)."""


@click.command()
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--kind",
    type=click.Choice(KINDS),
    default="ed25519",
    show_default=True,
    help="The key's algorithm: Ed25519, or ECDSA on P-256 or P-384.",
)
def keygen(out: Path, kind: str) -> None:
    """Write a new node key pair: OUT.key (mode 0600) and OUT.pub.

    OUT.key is the private key, OUT.pub its public key in OpenSSH form. Give OUT.key
    to the node (`fedcore serve --role node --auth-key OUT.key`) and add
    the line of OUT.pub to the link's --authorized-nodes file. Neither file is ever
    replaced.
    """
    from fedcore.auth.keys import PublicKey
    from fedcore.auth.secret_files import write_key_pair

    private, public = write_key_pair(out, cast("KeyKind", kind))
    fingerprint = PublicKey.parse(public.read_text(encoding="ascii")).fingerprint
    click.echo(f"wrote {private} and {public} ({kind}, {fingerprint})")
