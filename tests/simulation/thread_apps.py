"""A ClientApp that reports the compute threads its worker process was given."""

from __future__ import annotations

import os

import fedcore as fc
from fedcore.workers.threads import THREAD_VARIABLES

client = fc.ClientApp()


def _reply(msg: fc.Message, **metrics: int) -> fc.Message:
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord(metrics)}), reply_to=msg)


@client.query("environment")
def environment(msg: fc.Message, context: fc.Context) -> fc.Message:
    """Each thread variable as the process sees it; 0 where it is not set."""
    return _reply(msg, **{name: int(os.environ.get(name, "0")) for name in THREAD_VARIABLES})


@client.query("blas")
def blas(msg: fc.Message, context: fc.Context) -> fc.Message:
    """The threads numpy's BLAS runs, as the library itself says."""
    import numpy as np  # noqa: F401 (loaded, so that threadpoolctl finds its BLAS)
    import threadpoolctl

    pools = [pool for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]
    return _reply(msg, threads=max(pool["num_threads"] for pool in pools))
