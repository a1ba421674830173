"""The clients' side of HTTP: one aiohttp session to the link, and nothing of aiohttp leaking.

:class:`Session` makes the requests of each HTTP client (control, runtime, exec), and
:class:`SessionClient` gives them their one lifecycle: its ``async with`` opens and
closes the session. An answer that is not 2xx becomes the fedcore error that the
table of :mod:`fedcore.transport.http.errors` gives (a 401 that names the link's
name, ``X-Fedcore-Link``: :class:`~fedcore.errors.WrongLinkError`, so that an exec
signs again for it, :mod:`fedcore.auth.exec_signatures`); a link that cannot be reached
(nothing listens, the connection broke or timed out, the answer was cut short)
becomes :class:`~fedcore.errors.LinkUnavailableError`; an address that answers, but
not as fedcore does (the fleet API's gRPC port, some other HTTP server), becomes
:class:`~fedcore.errors.WrongServiceError`, which no retry can mend.
Bodies are read under a cap, not decompressed, and never followed to a redirect.
"""

from __future__ import annotations

import ssl as _ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp.abc import AbstractStreamWriter

from fedcore.auth.exec_signatures import LINK
from fedcore.errors import (
    DecodeError,
    FedcoreError,
    LinkUnavailableError,
    WrongLinkError,
    WrongServiceError,
)
from fedcore.transport.http.bodies import MAX_JSON_BYTES, WRITE_SLICE, read_at_most, read_payload
from fedcore.transport.http.errors import MAX_ERROR_BYTES, answer_error, is_error_document
from fedcore.wire.frame import Buffer, slices

TIMEOUT = 30.0
"""Seconds to connect, and for the link to answer a call beyond any wait it was asked for."""


class Body(aiohttp.Payload):
    """A body to send, given as bytes or as the parts of a payload, written in slices.

    aiohttp writes a ``bytes`` body to the socket in one piece, and warns when it is
    large; a batch of models or a bundle is large. Written a slice at a time, the
    body lets the event loop run between slices; given as parts
    (:data:`~fedcore.wire.Parts`), a payload is never joined, so a 200 MB model
    costs its sender no second 200 MB.
    """

    _value: Sequence[Buffer]

    def __init__(self, data: bytes | Sequence[Buffer], content_type: str) -> None:
        super().__init__([data] if isinstance(data, bytes) else data, content_type=content_type)

    @property
    def size(self) -> int:
        return sum(memoryview(part).nbytes for part in self._value)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._value).decode(encoding, errors)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        remaining = self.size if content_length is None else content_length
        for piece in slices(self._value, WRITE_SLICE):
            if remaining <= 0:
                return
            await writer.write(piece[:remaining])
            remaining -= piece.nbytes


READ_BUFFER = 4 << 20
"""Bytes a response is read in at most, per piece."""


class Session:
    """Requests to the link at ``host:port``; :meth:`open` before, :meth:`close` after."""

    def __init__(
        self, host: str, port: int, *, ssl: _ssl.SSLContext | None, timeout: float, api: str
    ) -> None:
        self.where = f"the link at {host}:{port}"
        self.address = f"{host}:{port}"
        self.api = api
        """Which of the link's APIs this session calls (``control API``): named in errors."""
        self.timeout = timeout
        name = f"[{host}]" if ":" in host else host  # an IPv6 address, as URLs write it
        self._base = f"{'https' if ssl else 'http'}://{name}:{port}"
        self._ssl = ssl
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(ssl=self._ssl or True)
        # A model in a response is megabytes: read it in large pieces, not aiohttp's
        # default 64 KiB, which pauses and resumes the socket for every piece.
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, read_bufsize=READ_BUFFER
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def timeouts(self, wait: float = 0.0) -> aiohttp.ClientTimeout:
        """A call whose answer may take ``wait`` seconds at the link, plus the usual.

        Only connecting and waiting for the answer are bounded, not sending the
        request: a large push takes as long as the network needs.
        """
        return aiohttp.ClientTimeout(sock_connect=self.timeout, sock_read=wait + self.timeout)

    def stream_timeouts(self) -> aiohttp.ClientTimeout:
        """A stream that may stay quiet indefinitely: only connecting is bounded."""
        return aiohttp.ClientTimeout(sock_connect=self.timeout)

    @asynccontextmanager
    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        timeout: aiohttp.ClientTimeout,
        params: Mapping[str, str] | None = None,
        data: Any = None,
        expect100: bool = False,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A response with a 2xx status, to read inside the block.

        Reading it inside the block translates aiohttp's errors too; the error of
        any other status is raised before the block runs.
        """
        if self._session is None:
            raise RuntimeError("the HTTP client is used outside its `async with` block")
        answered = False  # past the status line: what fails now is not about who answers
        try:
            async with self._session.request(
                method,
                self._base + path,
                headers=headers,
                params=params,
                data=data,
                timeout=timeout,
                expect100=expect100,
                allow_redirects=False,
            ) as response:
                answered = True
                if not 200 <= response.status < 300:
                    body = await read_at_most(response.content, MAX_ERROR_BYTES)
                    if _foreign(response.status, body):
                        raise WrongServiceError(
                            f"{self.address} is not a fedcore {self.api} (an HTTP server "
                            f"answered {method} {path} with HTTP {response.status}, "
                            f"not with a fedcore error)"
                        )
                    error = answer_error(response.status, body, self.where)
                    link = response.headers.get(LINK)
                    if response.status == 401 and link is not None:
                        raise WrongLinkError(str(error), link)  # sign again, for this link
                    raise error
                yield response
        except FedcoreError:
            raise
        except aiohttp.ClientResponseError as exc:
            if answered:
                raise LinkUnavailableError(
                    f"{self.where} is unavailable: {type(exc).__name__}: {exc}"
                ) from exc
            # No HTTP/1.1 status line came back.
            raise WrongServiceError(
                f"{self.address} is not a fedcore {self.api} (it looks like the fleet API's "
                f"gRPC port: it does not answer in HTTP/1.1)"
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError):
                raise LinkUnavailableError(
                    f"{self.where} is unavailable: nothing listens on {self.address} "
                    f"(connection refused)"
                ) from exc
            raise LinkUnavailableError(
                f"{self.where} is unavailable: {type(exc).__name__}: {exc}"
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:  # OSError: TimeoutError and raw resets
            raise LinkUnavailableError(
                f"{self.where} is unavailable: {type(exc).__name__}: {exc}"
            ) from exc

    async def read(self, response: aiohttp.ClientResponse, cap: int) -> bytes:
        """The body of ``response``; DecodeError if it is over ``cap`` bytes."""
        data = await read_at_most(response.content, cap)
        self._refuse_over(data, cap)
        return data

    async def read_payload(self, response: aiohttp.ClientResponse, cap: int) -> Buffer:
        """As :meth:`read`, for a payload: a large one is spooled, not held in memory."""
        data = await read_payload(response.content, cap)
        self._refuse_over(data, cap)
        return data

    def _refuse_over(self, data: Buffer, cap: int) -> None:
        if len(data) > cap:
            raise DecodeError(f"{self.where} answered with a body over the cap of {cap} bytes")

    async def call(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        timeout: aiohttp.ClientTimeout | None = None,
        params: Mapping[str, str] | None = None,
        data: Any = None,
        expect100: bool = False,
        cap: int = MAX_JSON_BYTES,
    ) -> bytes:
        """Make a request and return the body of its 2xx answer."""
        async with self.request(
            method,
            path,
            headers=headers,
            timeout=timeout or self.timeouts(),
            params=params,
            data=data,
            expect100=expect100,
        ) as response:
            return await self.read(response, cap)

    async def fetch_payload(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        cap: int,
        timeout: aiohttp.ClientTimeout | None = None,
        data: Any = None,
    ) -> Buffer:
        """Make a request; the payload its 2xx answer carries (see :meth:`read_payload`)."""
        timeout = timeout or self.timeouts()
        async with self.request(
            method, path, headers=headers, timeout=timeout, data=data
        ) as response:
            return await self.read_payload(response, cap)


def _foreign(status: int, body: bytes) -> bool:
    """Whether an error answer comes from a server that is not fedcore's.

    fedcore answers every error with its JSON document, except where a proxy or
    aiohttp's own limits may speak first: 502-504 (a proxy without a link behind
    it: unavailable, retried) and 413 (a body over aiohttp's cap).
    """
    return status not in (413, 502, 503, 504) and not is_error_document(body)


class SessionClient:
    """A client over one :class:`Session` to the link, used as an async context manager."""

    _session: Session

    async def __aenter__(self) -> Self:
        await self._session.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._session.close()
