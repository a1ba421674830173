"""The exec role: claims work and launches the app processes that do it.

On the link's side, :class:`~fedcore.roles.exec.launcher.ServerAppLauncher` claims
pending runs and starts one ServerApp process for each. It works through an
:class:`~fedcore.transport.exec.ExecService`: inside the link process over its
LinkState (the default), or in a process of its own over the link's signed exec API
(``fedcore serve --role exec``). On a node's side, the node's ClientApp processes
are started by its runner factory; see :mod:`fedcore.runtime.node`.
"""

from fedcore.roles.exec.launcher import ServerAppLauncher

__all__ = ["ServerAppLauncher"]
