"""Worker processes that run ClientApps: the simulation's process backend and a node's.

Starting them (here or through an exec), sizing a pool of them and capping their
threads, the shared memory that carries large payloads to and from them, the worker's
own main, and the one job scheduler that the process pool and the Ray backend are
channels of. The simulation's backends and a deployed node both build on this
package; it knows nothing of either.
"""
