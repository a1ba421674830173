"""A ClientApp that trains CPU-bound: matrix products for ``train-seconds`` of CPU time."""

from __future__ import annotations

import time

import numpy as np

import fedcore as fc

client = fc.ClientApp()


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((256, 256))
    started = time.process_time()
    while time.process_time() - started < context.run_config["train-seconds"]:
        weights = np.tanh(weights @ weights / 256)
    metrics = fc.MetricRecord({"norm": float(np.linalg.norm(weights))})
    return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)
