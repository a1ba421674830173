"""The ClientApp: returns the arrays it got, unchanged, so a round measures fedcore alone."""

from __future__ import annotations

import fedcore as fc

client = fc.ClientApp()


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    return fc.Message(fc.RecordDict({"arrays": msg.content["arrays"]}), reply_to=msg)
