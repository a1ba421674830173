"""A ClientApp whose module imports torch, as a PyTorch app's does, and reports its threads."""

from __future__ import annotations

import torch

import fedcore as fc

client = fc.ClientApp()


@client.query("torch")
def torch_threads(msg: fc.Message, context: fc.Context) -> fc.Message:
    """torch's intra-op threads."""
    metrics = fc.MetricRecord({"threads": torch.get_num_threads()})
    return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)
