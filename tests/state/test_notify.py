"""Topic: keyed callbacks that survive a failing subscriber."""

from __future__ import annotations

import logging

import pytest

from fedcore.state.notify import Topic


def test_a_keyed_subscriber_hears_only_its_key() -> None:
    topic: Topic[int, str] = Topic()
    heard: list[str] = []
    topic.subscribe(heard.append, 1)
    topic.publish(2, "two")
    topic.publish(1, "one")
    assert heard == ["one"]


def test_a_subscriber_without_key_hears_every_key() -> None:
    topic: Topic[int, str] = Topic()
    heard: list[str] = []
    topic.subscribe(heard.append)
    topic.publish(1, "one")
    topic.publish(2, "two")
    assert heard == ["one", "two"]


def test_a_failing_subscriber_is_logged_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic: Topic[str, int] = Topic()
    heard: list[int] = []

    def broken(value: int) -> None:
        raise RuntimeError(f"subscriber bug {value}")

    topic.subscribe(broken, "k")
    topic.subscribe(heard.append, "k")
    topic.subscribe(broken)
    topic.subscribe(heard.append)
    with caplog.at_level(logging.ERROR, logger="fedcore.state.notify"):
        topic.publish("k", 7)
    assert heard == [7, 7]
    failures = [r for r in caplog.records if r.name == "fedcore.state.notify"]
    assert len(failures) == 2
    assert all(r.exc_info and "subscriber bug 7" in str(r.exc_info[1]) for r in failures)


def test_a_closed_subscription_hears_nothing() -> None:
    topic: Topic[int, str] = Topic()
    heard: list[str] = []
    keyed = topic.subscribe(heard.append, 1)
    everything = topic.subscribe(heard.append)
    keyed.close()
    everything.close()
    topic.publish(1, "one")
    assert heard == []


def test_closing_twice_is_harmless() -> None:
    topic: Topic[int, str] = Topic()
    heard: list[str] = []
    first = topic.subscribe(heard.append, 1)
    first.close()
    second = topic.subscribe(heard.append, 1)
    first.close()
    topic.publish(1, "one")
    assert heard == ["one"]
    second.close()


def test_a_subscription_closes_at_the_end_of_its_with_block() -> None:
    topic: Topic[int, str] = Topic()
    heard: list[str] = []
    with topic.subscribe(heard.append, 1):
        topic.publish(1, "inside")
    topic.publish(1, "after")
    assert heard == ["inside"]


def test_closing_one_of_two_subscriptions_keeps_the_other() -> None:
    topic: Topic[int, str] = Topic()
    first: list[str] = []
    second: list[str] = []
    closed = topic.subscribe(first.append, 1)
    topic.subscribe(second.append, 1)
    closed.close()
    topic.publish(1, "one")
    assert (first, second) == ([], ["one"])


def test_a_subscriber_may_unsubscribe_while_being_called() -> None:
    topic: Topic[int, str] = Topic()
    heard: list[str] = []

    def once(value: str) -> None:
        heard.append(value)
        subscription.close()

    subscription = topic.subscribe(once, 1)
    topic.subscribe(heard.append, 1)
    topic.publish(1, "a")
    topic.publish(1, "b")
    assert heard == ["a", "a", "b"]
