"""The link's page: its runs, their progress and metrics, its nodes, in a browser.

Served by the control API at ``/ui``: three static files of this package (``ui/``),
written for it, with no third-party code and nothing fetched from elsewhere. They
hold no data, so loading them needs no token; the page asks for the link's control
token and presents it as a bearer header on each call to the JSON routes, which need
it as the CLI's calls do. The token never goes into a URL the browser sends:
``fedcore ui`` prints an address with the token in its fragment (``#token=…``),
which browsers keep to themselves, and the page moves it into the tab's session
storage and drops it from the address bar at once.

Every answer carries a Content-Security-Policy that allows this page's own script,
style and calls and nothing else (no inline script, no other origin, no framing), so
that text a run supplies (metric names, reasons), which the page writes as text and
never as markup, could not run even if it were.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import hdrs, web

PATH = "/ui"
"""Where the page is: the control API's address followed by this."""

_FILES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
_CONTENT = {name: (resources.files(__package__) / "ui" / name).read_bytes() for name in _FILES}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
"""What every file of the page is served with."""


def add_page(routes: web.UrlDispatcher) -> None:
    """Serve the page at :data:`PATH` (and its two other files under it)."""
    routes.add_get(PATH, _serve("index.html"), allow_head=False)
    for name in _FILES:
        routes.add_get(f"{PATH}/{name}", _serve(name), allow_head=False)


def _serve(name: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    body, content_type = _CONTENT[name], _FILES[name]

    async def serve_file(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=body,
            headers={**HEADERS, hdrs.CONTENT_TYPE: f"{content_type}; charset=utf-8"},
        )

    return serve_file
