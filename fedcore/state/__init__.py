"""The link's state: the :class:`LinkState` interface and its implementations.

``InMemoryLinkState`` serves simulation and tests; ``SqliteLinkState`` keeps a
deployment's state in a file that survives restarts. Both pass the conformance suite
in :mod:`fedcore.testing.linkstate`.
"""

from fedcore.state.base import LinkState
from fedcore.state.memory import InMemoryLinkState
from fedcore.state.notify import Subscription
from fedcore.state.sqlite import SqliteLinkState

__all__ = ["InMemoryLinkState", "LinkState", "SqliteLinkState", "Subscription"]
