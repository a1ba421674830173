"""``GridClientProxy``: a legacy client call made as a Message through the run's Grid.

The legacy ``Server`` calls ``proxy.fit(ins, timeout, group_id)`` from a worker
thread; the proxy translates ``ins`` to a RecordDict in Flower's legacy shape
(``fitins.parameters``, ``fitins.config``, …: :mod:`fedcore.legacy.conversion`),
sends it to its node with ``timeout`` as the Message's TTL, waits for the one reply
on the blocking :class:`~fedcore.apps.grid.SyncGrid`, and translates the reply back.
An error reply (the ClientApp raised, the node left, the TTL ran out) raises
:class:`~fedcore.errors.ErrorReplyError`, a ``ValueError`` as Flower's is, which the
server counts as that client's failure.

:func:`start_update_client_manager_thread` keeps a ``ClientManager`` in step with the
Grid's nodes for the whole run: one proxy per node, registered as nodes join and
unregistered as they leave.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from fedcore.domain import Message, MessageType, RecordDict
from fedcore.errors import ErrorReplyError, FedcoreError
from fedcore.legacy import conversion
from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.conversion import MessageTypeLegacy
from fedcore.legacy.types import (
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ReconnectIns,
)

_log = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0
"""How often the registration thread asks the Grid for its nodes, besides before each
``sample``, ``num_available`` and ``all``."""


class BlockingGrid(Protocol):
    """What a proxy needs of a Grid: :class:`~fedcore.apps.grid.SyncGrid`'s blocking calls."""

    def get_node_ids(self) -> list[int]: ...

    def send_and_receive(self, messages: list[Message]) -> list[Message]: ...


class GridClientProxy(ClientProxy):
    """The client on node ``node_id`` of run ``run_id``; ``cid`` is the node id as a string."""

    def __init__(self, node_id: int, grid: BlockingGrid, run_id: int) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id
        self.grid = grid
        self.run_id = run_id

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None = None
    ) -> GetPropertiesRes:
        content = conversion.getpropertiesins_to_recorddict(ins)
        reply = self._send(content, MessageTypeLegacy.GET_PROPERTIES, timeout, group_id)
        return conversion.recorddict_to_getpropertiesres(reply)

    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None = None
    ) -> GetParametersRes:
        content = conversion.getparametersins_to_recorddict(ins)
        reply = self._send(content, MessageTypeLegacy.GET_PARAMETERS, timeout, group_id)
        return conversion.recorddict_to_getparametersres(reply, False)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None = None) -> FitRes:
        content = conversion.fitins_to_recorddict(ins, True)
        reply = self._send(content, MessageType.TRAIN, timeout, group_id)
        return conversion.recorddict_to_fitres(reply, False)

    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None = None
    ) -> EvaluateRes:
        content = conversion.evaluateins_to_recorddict(ins, True)
        reply = self._send(content, MessageType.EVALUATE, timeout, group_id)
        return conversion.recorddict_to_evaluateres(reply)

    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None = None
    ) -> DisconnectRes:
        """Nothing to tell the node: its connection is the link's, not the run's."""
        return DisconnectRes(reason="")

    def _send(
        self, content: RecordDict, message_type: str, timeout: float | None, group_id: int | None
    ) -> RecordDict:
        """The content of the one reply to ``content``; an error reply raises."""
        message = Message(
            content,
            self.node_id,
            message_type,
            ttl=timeout,
            group_id=str(group_id) if group_id else "",
        )
        replies = list(self.grid.send_and_receive([message]))
        if len(replies) != 1:
            raise ErrorReplyError(
                f"node {self.node_id} sent {len(replies)} replies to a {message_type} "
                "message; one was expected"
            )
        [reply] = replies
        if reply.has_error():
            raise ErrorReplyError(
                f"node {self.node_id} answered the {message_type} message with an error "
                f"(code {reply.error.code}): {reply.error.reason}"
            )
        return reply.content


def start_update_client_manager_thread(
    grid: BlockingGrid, client_manager: ClientManager
) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """Keep ``client_manager`` holding a :class:`GridClientProxy` per node of ``grid``.

    From now on ``client_manager``'s ``sample``, ``num_available`` and ``all`` bring it
    up to date first, and a thread does so every :data:`REFRESH_SECONDS`, so a
    ``sample`` waiting for more clients sees nodes that join. Returns the thread, the
    event that stops it (set it, then join the thread) and the event set once the
    manager is wrapped.
    """
    stop = threading.Event()
    ready = threading.Event()
    thread = threading.Thread(
        target=_keep_registered,
        args=(grid, client_manager, stop, ready),
        name="fedcore-legacy-nodes",
        daemon=True,
    )
    thread.start()
    return thread, stop, ready


def _keep_registered(
    grid: Any, client_manager: ClientManager, stop: threading.Event, ready: threading.Event
) -> None:
    registered: dict[int, GridClientProxy] = {}
    lock = threading.RLock()

    def update() -> None:
        with lock:
            node_ids = set(grid.get_node_ids())
            for node_id in set(registered) - node_ids:
                client_manager.unregister(registered.pop(node_id))
            for node_id in node_ids - set(registered):
                proxy = GridClientProxy(node_id=node_id, grid=grid, run_id=grid.run.run_id)
                if not client_manager.register(proxy):
                    raise RuntimeError(f"node {node_id} is registered already")
                registered[node_id] = proxy

    def updating(method: Callable[..., Any]) -> Callable[..., Any]:
        def updated_first(*args: Any, **kwargs: Any) -> Any:
            update()
            return method(*args, **kwargs)

        return updated_first

    for name in ("num_available", "all", "sample"):
        setattr(client_manager, name, updating(getattr(client_manager, name)))
    ready.set()
    while not stop.is_set():
        stop.wait(REFRESH_SECONDS)
        if stop.is_set():
            return
        try:
            update()
        except (FedcoreError, RuntimeError) as exc:  # the run or its event loop ended
            _log.debug("stopped following the run's nodes: %s", exc)
            return
