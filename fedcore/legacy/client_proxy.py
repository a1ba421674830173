"""``ClientProxy``: the legacy server's handle on one client, called like the client itself.

A legacy strategy picks proxies from a :class:`~fedcore.legacy.client_manager.ClientManager`
and the legacy ``Server`` calls their ``fit``/``evaluate`` from worker threads, each
call blocking until the client's answer or ``timeout``. fedcore's proxy sends a Message
through the Grid for each call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

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
    Properties,
    ReconnectIns,
)


class ClientProxy(ABC):
    """One client as the legacy server sees it; ``cid`` is its id as a string."""

    node_id: int

    def __init__(self, cid: str) -> None:
        self.cid = cid
        self.properties: Properties = {}

    @abstractmethod
    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes: ...

    @abstractmethod
    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None
    ) -> GetParametersRes: ...

    @abstractmethod
    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes: ...

    @abstractmethod
    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None
    ) -> EvaluateRes: ...

    @abstractmethod
    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None
    ) -> DisconnectRes: ...
