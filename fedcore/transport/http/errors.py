"""fedcore's errors as HTTP answers, and back: one table for both sides.

The server answers an error with a status and a JSON body ``{"error": name,
"message": one line}``, where ``name`` is the class of the fedcore error (or its
nearest ancestor the client knows), so that the client raises that same class:

==========================================================  ======
NotFoundError and its subclasses (RunNotFoundError, ...)    404
StateError: ConflictError, RunFinishedError, ClaimLostError,
InvalidTransitionError, ReplyRejectedError                  409
UsageError (BundleError, ...), DecodeError, other ValueError  400
a body over its cap                                         413
LinkUnavailableError                                        503
the control API's bearer token missing or wrong             401
anything else                                               500, no detail
==========================================================  ======

A 500 says "internal error" and nothing else (no class, no traceback, no path):
the server logs what happened. The client accepts a name only if it belongs under
the status (a 404 raises a NotFoundError, never a ConflictError), turns 502, 503 and
504 (the link shutting down, or a proxy in front of it without a link behind) into
:class:`~fedcore.errors.LinkUnavailableError`, a 401 into
:class:`~fedcore.errors.AuthenticationError`, and anything else it does not
expect into a plain :class:`~fedcore.errors.FedcoreError`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs, web

from fedcore.errors import (
    AppLoadError,
    AuthenticationError,
    BundleError,
    ClaimLostError,
    ConflictError,
    DecodeError,
    FedcoreError,
    InvalidTransitionError,
    LinkUnavailableError,
    MessageNotFoundError,
    NodeNotFoundError,
    NotFoundError,
    ReplyRejectedError,
    RunConfigError,
    RunFinishedError,
    RunNotFoundError,
    StateError,
    UsageError,
)
from fedcore.transport.http.bodies import JSON, dumps, loads, one_line

INTERNAL = "internal error"
MAX_ERROR_BYTES = 64 * 1024
"""The most of an error body a client reads."""
KINDS: dict[str, type[FedcoreError]] = {
    kind.__name__: kind
    for kind in (
        NotFoundError,
        RunNotFoundError,
        NodeNotFoundError,
        MessageNotFoundError,
        StateError,
        ConflictError,
        ReplyRejectedError,
        RunFinishedError,
        InvalidTransitionError,
        ClaimLostError,
        UsageError,
        AppLoadError,
        RunConfigError,
        BundleError,
        DecodeError,
        LinkUnavailableError,
    )
}
_STATUSES: tuple[tuple[type[Exception], int, type[FedcoreError]], ...] = (
    # what was raised, its status, and the name to send when no closer one is known
    (NotFoundError, 404, NotFoundError),
    (StateError, 409, StateError),
    (LinkUnavailableError, 503, LinkUnavailableError),
    (ValueError, 400, DecodeError),
)
_EXPECTED: dict[int, tuple[type[FedcoreError], ...]] = {
    # what a client accepts under each status, the first being what it raises otherwise
    400: (DecodeError, UsageError),
    404: (NotFoundError,),
    409: (StateError,),
    413: (DecodeError, UsageError),
}
_UNAVAILABLE = frozenset({502, 503, 504})


def error_document(kind: type[FedcoreError] | None, message: str) -> dict[str, Any]:
    return {"error": "" if kind is None else kind.__name__, "message": one_line(message)}


def expected_error(exc: Exception) -> tuple[int, dict[str, Any]] | None:
    """The status and body that answer ``exc``, or None when it is not an expected error."""
    for raised, status, default in _STATUSES:
        if isinstance(exc, raised):
            kind = next((cls for cls in type(exc).__mro__ if KINDS.get(cls.__name__) is cls), None)
            return status, error_document(kind or default, str(exc))
    return None


def error_response(status: int, document: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=dumps(document), content_type=JSON)


def internal_error() -> web.Response:
    return error_response(500, error_document(None, INTERNAL))


def too_large(kind: type[FedcoreError], message: str) -> web.HTTPRequestEntityTooLarge:
    """The 413 to raise from a handler when a body is over its cap.

    Raised rather than returned so that the code reading the body can stop there;
    aiohttp answers with it as it is.
    """
    return web.HTTPRequestEntityTooLarge(
        0, 0, text=dumps(error_document(kind, message)).decode(), content_type=JSON
    )


def unauthorized() -> web.HTTPUnauthorized:
    """The 401 of the control API for a missing or wrong bearer token."""
    return web.HTTPUnauthorized(
        headers={hdrs.WWW_AUTHENTICATE: "Bearer"},
        text=dumps(error_document(None, "a valid bearer token is required")).decode(),
        content_type=JSON,
    )


def is_error_document(body: bytes) -> bool:
    """Whether ``body`` is an error answer as fedcore's servers write one."""
    try:
        document = loads(body)
    except DecodeError:
        return False
    return (
        isinstance(document, dict)
        and isinstance(document.get("error"), str)
        and isinstance(document.get("message"), str)
    )


def answer_error(status: int, body: bytes, where: str) -> FedcoreError:
    """The error a client raises for an answer with ``status`` (not 2xx) and ``body``."""
    try:
        document = loads(body)
    except DecodeError:
        return error_from(status, {"message": body.decode("utf-8", "replace")}, where)
    return error_from(status, document, where)


def error_from(status: int, document: object, where: str) -> FedcoreError:
    """The error that ``status`` and an error ``document`` (as the server sends) stand for.

    A document that is not one of ours has no name, and its text is the message.
    """
    name, message = "", "no detail"
    if isinstance(document, dict):
        found_name, found_message = document.get("error", ""), document.get("message")
        if isinstance(found_name, str) and isinstance(found_message, str):
            name, message = found_name, one_line(found_message) or message
    if status in _UNAVAILABLE:
        return LinkUnavailableError(f"{where} is unavailable (HTTP {status}): {message}")
    if status == 401:
        return AuthenticationError(f"{where} refused the request: {message}")
    expected = _EXPECTED.get(status)
    if expected is None:
        return FedcoreError(f"{where} failed the request with HTTP {status}: {message}")
    kind = KINDS.get(name)
    if kind is None or not issubclass(kind, expected):
        kind = expected[0]
    return kind(message)
