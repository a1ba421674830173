"""Every node gets a ConfigRecord with a ``value-bytes`` long ``bytes`` and ``str`` and
sends it back (adding an ``extra`` bytes value ``reply-extra-bytes`` long); ``main``
fails the run if a reply is not what it sent, and prints ``echoed R rounds`` when every
round came back intact.

The values are built from the round number, so a reply from another round or a shifted
byte shows; the str mixes one- to four-byte UTF-8 characters, so a value cut between
the bytes of a character shows too.
"""

from __future__ import annotations

import fedcore as fc

client = fc.ClientApp()
server = fc.ServerApp()


def values(server_round: int, size: int) -> tuple[bytes, str]:
    """A ``size``-byte bytes and a str of ``size`` bytes in UTF-8, different each round."""
    blob = (bytes(range(256)) * (size // 256 + 1))[server_round : server_round + size]
    unit = f"a{server_round}é€😀"
    text = unit * (size // len(unit.encode()))
    return blob, text + "z" * (size - len(text.encode()))


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    config = msg.content["config"]
    extra = b"e" * int(context.run_config["reply-extra-bytes"])
    echoed = fc.ConfigRecord({"blob": config["blob"], "text": config["text"], "extra": extra})
    return fc.Message(fc.RecordDict({"config": echoed}), reply_to=msg)


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    config = context.run_config
    wanted, size = int(config["nodes"]), int(config["value-bytes"])
    nodes = sorted(await grid.wait_for_nodes(wanted, timeout=60.0))[:wanted]
    for server_round in range(1, int(config["rounds"]) + 1):
        blob, text = values(server_round, size)
        content = fc.RecordDict({"config": fc.ConfigRecord({"blob": blob, "text": text})})
        messages = [fc.Message(content, node_id, "train") for node_id in nodes]
        replies = await grid.send_and_receive(messages, timeout=60.0)
        for reply in replies:
            if reply.has_error():
                raise RuntimeError(f"round {server_round}: a node answered {reply.error}")
            echoed = reply.content["config"]
            if echoed["blob"] != blob or echoed["text"] != text:
                raise RuntimeError(f"round {server_round}: a node sent back other values")
        if len(replies) != wanted:
            raise RuntimeError(f"round {server_round}: {len(replies)} of {wanted} replies")
    print(f"echoed {server_round} rounds")
