"""Which clients a legacy server may call: ``ClientManager`` and its ``Criterion``.

Legacy strategies sample clients from a manager (``configure_fit`` calls
``client_manager.sample(n, min_num_clients=m)``), which waits until enough are
registered. Waiting is on a condition variable: the manager is shared between the
thread that registers nodes as they join and the rounds that sample them.
"""

from __future__ import annotations

import logging
import random
import threading
from abc import ABC, abstractmethod

from fedcore.legacy.client_proxy import ClientProxy

_log = logging.getLogger("flwr")


class Criterion(ABC):
    """A filter on the clients ``sample`` may pick."""

    @abstractmethod
    def select(self, client: ClientProxy) -> bool: ...


class ClientManager(ABC):
    """The registry of clients a legacy server can reach."""

    @abstractmethod
    def num_available(self) -> int: ...

    @abstractmethod
    def register(self, client: ClientProxy) -> bool:
        """Add ``client``; False if a client of that ``cid`` is registered already."""

    @abstractmethod
    def unregister(self, client: ClientProxy) -> None: ...

    @abstractmethod
    def all(self) -> dict[str, ClientProxy]: ...

    @abstractmethod
    def wait_for(self, num_clients: int, timeout: int) -> bool:
        """Block until ``num_clients`` are registered or ``timeout`` s passed; whether they are."""

    @abstractmethod
    def sample(
        self,
        num_clients: int,
        min_num_clients: int | None = None,
        criterion: Criterion | None = None,
    ) -> list[ClientProxy]: ...


class SimpleClientManager(ClientManager):
    """Clients by ``cid``; ``sample`` draws uniformly with the ``random`` module's generator."""

    def __init__(self) -> None:
        self.clients: dict[str, ClientProxy] = {}
        self._cv = threading.Condition()

    def __len__(self) -> int:
        return len(self.clients)

    def num_available(self) -> int:
        return len(self)

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: len(self.clients) >= num_clients, timeout=timeout)

    def register(self, client: ClientProxy) -> bool:
        if client.cid in self.clients:
            return False
        self.clients[client.cid] = client
        with self._cv:
            self._cv.notify_all()
        return True

    def unregister(self, client: ClientProxy) -> None:
        if client.cid in self.clients:
            del self.clients[client.cid]
            with self._cv:
                self._cv.notify_all()

    def all(self) -> dict[str, ClientProxy]:
        return self.clients

    def sample(
        self,
        num_clients: int,
        min_num_clients: int | None = None,
        criterion: Criterion | None = None,
    ) -> list[ClientProxy]:
        """``num_clients`` clients drawn without replacement, once ``min_num_clients``
        (default ``num_clients``) are registered; none if fewer pass ``criterion``."""
        self.wait_for(num_clients if min_num_clients is None else min_num_clients)
        available = list(self.clients)
        if criterion is not None:
            available = [cid for cid in available if criterion.select(self.clients[cid])]
        if num_clients > len(available):
            _log.info(
                "Sampling failed: number of available clients (%s) is less than number "
                "of requested clients (%s).",
                len(available),
                num_clients,
            )
            return []
        return [self.clients[cid] for cid in random.sample(available, num_clients)]
