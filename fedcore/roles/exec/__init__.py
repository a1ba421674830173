"""The exec role: claims work and launches the app processes that do it.

On the link's side, :class:`~fedcore.roles.exec.launcher.ServerAppLauncher` claims
pending runs and starts one ServerApp process for each. (On a node's side, the
node's ClientApp processes are started by its runner factory; see
:mod:`fedcore.runtime.node`.)
"""

from fedcore.roles.exec.launcher import ServerAppLauncher

__all__ = ["ServerAppLauncher"]
