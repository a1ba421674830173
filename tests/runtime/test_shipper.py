"""The Shipper's batches: named by the shipper, or one item each named by ``named``;
a failed send is retried under the same name; ``drain`` returns once all is sent."""

from __future__ import annotations

import anyio
import pytest

from fedcore.errors import LinkUnavailableError
from fedcore.runtime.logship import Shipper

pytestmark = pytest.mark.anyio


class _Link:
    """Appends a batch unless its name is the one appended last (the link's rule)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.items: list[str] = []
        self.names: list[str] = []
        self._fail = fail_first

    async def send(self, items: list[str], batch: str) -> None:
        if self._fail:
            self._fail -= 1
            raise LinkUnavailableError("the link is away")
        if self.names and self.names[-1] == batch:
            return
        self.names.append(batch)
        self.items += items


async def test_items_are_batched_under_the_shipper_s_names() -> None:
    link = _Link()
    async with Shipper(link.send) as shipper:
        for item in "abc":
            shipper.put(item)
        await shipper.drain()
        assert link.items == ["a", "b", "c"]  # on the link when drain returns
    assert len(set(link.names)) == len(link.names)


async def test_named_items_are_a_batch_each_and_one_sent_again_is_appended_once() -> None:
    link = _Link()
    async with Shipper(link.send, named=str.upper) as shipper:
        shipper.put("a")
        shipper.put("b")
        await shipper.drain()
    assert (link.items, link.names) == (["a", "b"], ["A", "B"])
    # A relaunched process sends its predecessor's last item again: appended once.
    async with Shipper(link.send, named=str.upper) as again:
        again.put("b")
        again.put("c")
    assert link.items == ["a", "b", "c"]


async def test_a_send_that_failed_is_retried_under_its_name() -> None:
    link = _Link(fail_first=1)
    shipper = Shipper(link.send, named=str.upper)
    shipper.put("a")
    with pytest.raises(LinkUnavailableError):
        await shipper.drain()
    with anyio.fail_after(5):
        await shipper.drain()
    assert (link.items, link.names) == (["a"], ["A"])
