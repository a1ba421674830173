"""The link's state: the :class:`LinkState` interface and its implementations.

``InMemoryLinkState`` serves simulation and tests;
``fedcore.state.sqlite.SqliteLinkState`` keeps a deployment's state in a file that
survives restarts. Both keep and schedule what the rules of :mod:`fedcore.state.ledger`
decide, and pass the conformance suites of :mod:`fedcore.testing.linkstate`,
``runstate`` and ``recordstate``. The SQLite one is imported from its module, not from
here: every simulation and every worker process imports this package, and should not pay
for sqlite3 and the SQL files it never uses.
"""

from fedcore.state.base import LinkState
from fedcore.state.memory import InMemoryLinkState
from fedcore.state.notify import Subscription

__all__ = ["InMemoryLinkState", "LinkState", "Subscription"]
