"""The control API's bearer token: where the link keeps it, and which one a command sends.

The control API runs code on the link and on every node (a run is an app), so it is
closed by default: on its first start the link writes a random token to
``control.token`` in its work directory (or to ``--control-token-file``), mode 0600
(:func:`~fedcore.auth.secret_files.read_secret`), and wants it on every request
(:class:`BearerToken`).
``fedcore run / ls / log / stop`` send the first of (:func:`client_token`):

1. the token in the file ``--token-file`` names;
2. ``$FEDCORE_CONTROL_TOKEN``;
3. the token of a link started here with the default work directory,
   ``.fedcore-link/control.token`` under the current directory — for a link on
   loopback only: a link on another machine is never sent this machine's token.

A command cannot know a work directory the link was given on its command line;
``--token-file`` names it, and a refusal says so (:attr:`ClientToken.hint`).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fedcore.auth.admission import Arrival, Door, bearer
from fedcore.auth.secret_files import read_existing_secret
from fedcore.errors import AuthenticationError

TOKEN_ENV = "FEDCORE_CONTROL_TOKEN"
TOKEN_FILE = "control.token"
"""The token's file in the link's work directory."""
LINK_WORK_DIR = Path(".fedcore-link")
"""The link's work directory unless ``--work-dir`` says otherwise (relative: where it starts)."""
WHAT = "control token"
FIX = (
    f"give --token-file with the link's token file (<its work dir>/{TOKEN_FILE}, or its "
    f"--control-token-file) or set ${TOKEN_ENV}"
)


class BearerToken(Door[None, None]):
    """The control API's door: ``Authorization: Bearer <token>``, compared in constant time."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the control token must not be empty")
        self._token = token.encode()

    def present(self, arrival: Arrival) -> None:
        if not hmac.compare_digest(bearer(arrival.headers).encode(), self._token):
            raise AuthenticationError("a valid bearer token is required")

    async def check(self, arrival: Arrival, presented: None) -> None:
        """The token covers no body: none is read."""


def link_token_file(work_dir: Path, token_file: Path | None = None) -> Path:
    """Where a link with ``work_dir`` keeps its token: ``token_file`` if given."""
    return token_file if token_file is not None else work_dir / TOKEN_FILE


class LinkAddress(Protocol):
    """Where a command finds the link: all the token's choice needs of an address."""

    @property
    def is_loopback(self) -> bool: ...


@dataclass(frozen=True)
class ClientToken:
    """The token a command sends (None: none found), and where it came from."""

    token: str | None
    source: str
    """``--token-file PATH``, ``$FEDCORE_CONTROL_TOKEN`` or the default file's path."""

    @property
    def hint(self) -> str:
        """What to tell a person whose request the link refused: what was sent, and the fix."""
        if self.token is None:
            return f"no token was sent: {FIX}"
        return f"the token from {self.source} is not this link's: {FIX}"


def client_token(
    token_file: Path | None,
    *,
    link: LinkAddress,
    environ: Mapping[str, str] = os.environ,
    cwd: Path | None = None,
) -> ClientToken:
    """The token a command talking to ``link`` sends, in the order the module gives.

    A ``token_file`` that is missing or unreadable is a ``UsageError`` naming it; the
    default file is only looked for, and skipped when absent.
    """
    if token_file is not None:
        return ClientToken(
            read_existing_secret(token_file, what=WHAT), f"--token-file {token_file}"
        )
    if environ.get(TOKEN_ENV, "").strip():
        return ClientToken(environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}")
    default = (cwd or Path.cwd()) / link_token_file(LINK_WORK_DIR)
    if link.is_loopback and default.is_file():
        return ClientToken(read_existing_secret(default, what=WHAT), str(default))
    return ClientToken(None, "nowhere")
