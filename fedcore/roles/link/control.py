"""The link's side of the control API: submit, list, show, follow and stop runs, read their record.

:class:`LinkControl` implements :class:`~fedcore.transport.control.ControlService`
over the LinkState. Submitting a run unpacks its bundle into the link's cache
first (off the event loop): a bundle that is unsafe, over a limit or not an app is
refused there, with the reason, before a run exists and before the state stores
it — a refused bundle costs the link no storage, in the state or in the cache — and
the exec that launches the run later finds it unpacked already.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

import anyio
import anyio.to_thread

from fedcore.apps.bundle import unpack_bundle
from fedcore.apps.project import read_project
from fedcore.domain import LogLine, MetricsLine, RecordDict, Run, RunStatus, UserConfigValue
from fedcore.errors import AppLoadError, BundleError, UsageError
from fedcore.state.base import LinkState
from fedcore.state.notify import Subscription
from fedcore.transport.control import ControlService, Health, NodeInfo

log = logging.getLogger(__name__)

LOG_PAGE = 1000
"""Log or metrics lines read from the state per query while streaming them."""


class _Numbered(Protocol):
    @property
    def seq(self) -> int: ...


Line = TypeVar("Line", bound=_Numbered)


class AuthorizedList(Protocol):
    """The nodes the link admits, kept where the operator keeps them (a file) and in force."""

    def keys(self) -> list[str]:
        """The keys listed, one OpenSSH line each."""
        ...

    def add(self, public_key: str) -> list[str]:
        """List ``public_key`` and admit it at once; the list after (``UsageError`` if no key)."""
        ...

    def remove(self, public_key: str) -> list[str]:
        """Unlist ``public_key`` and refuse it at once; the list after."""
        ...


class LinkControl(ControlService):
    """The control API over ``state``; bundles unpack into ``bundle_cache``.

    ``authorized``: the link's list of admitted nodes, when it keeps one.
    """

    def __init__(
        self,
        state: LinkState,
        bundle_cache: Path,
        *,
        version: str,
        authorized: AuthorizedList | None = None,
    ) -> None:
        self._state = state
        self._bundle_cache = bundle_cache
        self._version = version
        self._authorized = authorized

    async def submit_run(self, bundle: bytes, run_config: Mapping[str, UserConfigValue]) -> Run:
        bundle_hash = await anyio.to_thread.run_sync(bundle_sha256, bundle)
        await anyio.to_thread.run_sync(check_app_bundle, bundle, bundle_hash, self._bundle_cache)
        await self._state.put_bundle(bundle)
        seed = run_config.get("seed")
        run = await self._state.create_run(
            dict(run_config),
            seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
            bundle_hash=bundle_hash,
        )
        log.info("run %d submitted (bundle %s…)", run.run_id, bundle_hash[:12])
        return run

    async def list_runs(self) -> list[Run]:
        return await self._state.list_runs()

    async def get_run(self, run_id: int) -> Run:
        return await self._state.get_run(run_id)

    async def stop_run(self, run_id: int) -> Run:
        run = await self._state.get_run(run_id)
        if run.status.finished:
            return run
        log.info("run %d stopped by the operator", run_id)
        return await self._state.update_run_status(
            run_id, RunStatus.STOPPED, "stopped by the operator"
        )

    def logs(self, run_id: int, *, after: int = 0, follow: bool = False) -> AsyncIterator[LogLine]:
        state = self._state
        return self._lines(run_id, state.watch_logs, state.get_logs, after, follow)

    def metrics(
        self, run_id: int, *, after: int = 0, follow: bool = False
    ) -> AsyncIterator[MetricsLine]:
        state = self._state
        return self._lines(run_id, state.watch_metrics, state.get_metrics, after, follow)

    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        return await self._state.get_artifact(run_id, name)

    async def _lines(
        self,
        run_id: int,
        watch: Callable[[int, Callable[[int], None]], Subscription],
        get: Callable[..., Awaitable[list[Line]]],
        after: int,
        follow: bool,
    ) -> AsyncIterator[Line]:
        """A run's numbered lines above ``after``; with ``follow``, until it has finished."""
        changed = anyio.Event()

        def wake(_: int) -> None:
            changed.set()

        with watch(run_id, wake), self._state.watch_runs(wake):
            while True:
                # Read the status before the lines: lines appended before the run
                # finished are then all in the pages read after it.
                finished = (await self._state.get_run(run_id)).status.finished
                while lines := await get(run_id, after=after, limit=LOG_PAGE):
                    for line in lines:
                        yield line
                    after = lines[-1].seq
                if not follow or finished:
                    return
                await changed.wait()
                changed = anyio.Event()

    async def list_nodes(self) -> list[NodeInfo]:
        return [NodeInfo(node_id, online=True) for node_id in await self._state.get_node_ids()]

    async def authorized_nodes(self) -> list[str]:
        return self._list().keys()

    async def authorize_node(self, public_key: str) -> list[str]:
        listed = self._list().add(public_key)
        log.info("a node key was authorized by the operator: %d keys listed", len(listed))
        return listed

    async def deauthorize_node(self, public_key: str) -> list[str]:
        listed = self._list().remove(public_key)
        log.info("a node key was unlisted by the operator: %d keys listed", len(listed))
        return listed

    def _list(self) -> AuthorizedList:
        if self._authorized is None:
            raise UsageError(
                "this link admits any node key (trust on first use): start it with "
                "--authorized-nodes FILE to keep a list"
            )
        return self._authorized

    async def health(self) -> Health:
        runs = await self._state.list_runs()
        nodes = await self._state.get_node_ids()
        active = sum(not run.status.finished for run in runs)
        return Health(self._version, runs_active=active, nodes_online=len(nodes))


def bundle_sha256(bundle: bytes) -> str:
    """The hash a bundle is known by (as :meth:`LinkState.put_bundle` computes it)."""
    return hashlib.sha256(bundle).hexdigest()


def check_app_bundle(bundle: bytes, bundle_hash: str, cache: Path) -> Path:
    """Unpack ``bundle`` into ``cache`` and check it declares a ServerApp and a ClientApp.

    The check runs before the unpacked files enter the cache, so a bundle that fails
    it, for whatever reason, leaves nothing there.
    """
    return unpack_bundle(bundle, bundle_hash, cache, check=_check_app_table)


def _check_app_table(app_dir: Path) -> None:
    try:
        read_project(app_dir)
    except AppLoadError as exc:
        # The error names the link's cache path, which is not the submitter's business.
        reason = str(exc).replace(f"{app_dir}/", "").replace(str(app_dir), "it")
        raise BundleError(f"the bundle is not an app: {reason}") from None
