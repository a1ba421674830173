"""The node role: registers with the link, pulls messages under a lease, runs them, replies.

``async with Node(fleet, ...) as node:`` serves the link's messages while the body
runs and shuts down in order when it ends (see :mod:`fedcore.roles.node.node`).
Each run's ClientApp runs in a :class:`ClientAppRunner` that the composition root's
:data:`RunnerFactory` builds, so the role depends on no particular way of running
it.
"""

from fedcore.backoff import Backoff, BackoffPolicy
from fedcore.roles.node.node import Node
from fedcore.roles.node.runner import ClientAppRunner, RunnerFactory

__all__ = ["Backoff", "BackoffPolicy", "ClientAppRunner", "Node", "RunnerFactory"]
