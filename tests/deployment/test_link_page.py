"""The link's page in a real browser, against a live link with a deployed run in progress.

A link and two nodes on loopback, a run of ``record_app`` whose rounds take a second
or so each, and headless Chromium (Debian's) loading the address ``fedcore ui``
prints: the page must list the run and the nodes, show the run's progress, and its
chart must gain a point as each round finishes — seen while the run is still going —
until it has one per round. Text the run supplies (here a metric named as markup) is
shown as text and runs nothing; the token leaves the address bar; a wrong token
brings back the form that asks for one.

Skipped, saying so, only where no Chromium is installed (``apt-get install chromium``,
or ``$FEDCORE_CHROMIUM``): CI installs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import Chromium, find_chromium

from fedcore.testing.deployment import Deployment
from fedcore.testing.waiting import wait_until

RECORD_APP = Path(__file__).resolve().parent / "record_app"
ROUNDS = 5
MARKUP = '<img src=x onerror="window.pwned=1">'
"""A metric's name: what the page must show as text, never as an element."""
DEADLINE = 60.0

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

PAGE_STATE = """(() => {
  const row = document.querySelector('#runs tr[data-run-id="%s"]');
  const chart = document.getElementById('chart');
  if (chart === null || document.readyState !== 'complete') return {loading: true};
  return {
    listed: row !== null,
    status: row ? row.dataset.status : null,
    progress: row ? row.querySelector('td.progress').textContent : null,
    points: Number(chart.dataset.points),
    circles: chart.querySelectorAll('circle.point').length,
    metric: chart.dataset.metric || null,
    nodes: document.getElementById('node-count').textContent,
    asking: getComputedStyle(document.getElementById('login')).display !== 'none',
  };
})()"""


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Chromium]:
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium to load the page in: apt-get install chromium, or set "
                    "$FEDCORE_CHROMIUM")  # fmt: skip
    (tmp_path / "profile").mkdir()
    with Chromium(executable, tmp_path / "profile") as browser:
        yield browser


def page_once(
    look: Callable[[], dict[str, Any]], wanted: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """What the page shows once ``wanted`` holds of it; a timeout shows what it showed last."""
    shown: list[dict[str, Any]] = [{}]

    def condition() -> dict[str, Any] | None:
        shown[0] = look()
        return shown[0] if wanted(shown[0]) else None

    return wait_until(
        condition, DEADLINE, lambda: f"the page to get there: {shown[0]}", interval=0.1
    )


def test_the_page_shows_a_deployed_run_as_it_goes(tmp_path: Path, chromium: Chromium) -> None:
    with Deployment(tmp_path / "federation") as deployment:
        deployment.start_link()
        for index in range(2):
            deployment.start_node(f"partition-id={index} num-partitions=2")
        shown = deployment.fedcore("ui")
        assert shown.returncode == 0, shown.stderr
        url = shown.stdout.strip()
        address, _, fragment = url.partition("#")
        assert fragment.startswith("token=")
        run_id = deployment.submit(
            RECORD_APP, rounds=ROUNDS, **{"train-seconds": 1.5, "metric-name": MARKUP}
        )
        chromium.open(url)

        def look() -> dict[str, Any]:
            """What the page shows; a page still loading shows nothing yet."""
            state: dict[str, Any] = chromium.evaluate(PAGE_STATE % run_id)
            if state.get("loading"):
                return {"listed": False, "asking": False, "points": 0, "status": None}
            return state

        listed = page_once(look, lambda state: state["listed"])
        assert not listed["asking"]
        assert chromium.evaluate("location.href") == address  # the token left the address
        # While the run goes, its chart gains points as its rounds finish.
        first = page_once(look, lambda state: state["points"] >= 1)
        assert first["status"] == "running", first
        later = page_once(look, lambda state: state["points"] > first["points"])
        assert later["circles"] == later["points"]
        assert later["progress"] == f"round {later['points']}/{ROUNDS}"
        done = page_once(look, lambda state: state["status"] == "finished:completed")
        done = page_once(look, lambda state: state["points"] == ROUNDS)
        assert done["circles"] == ROUNDS
        assert done["progress"] == f"round {ROUNDS}/{ROUNDS}"
        assert done["nodes"] == "2"
        assert chromium.evaluate("document.querySelectorAll('#nodes li').length") == 2
        # Text a run supplies is text.
        assert done["metric"] == f"server.{MARKUP}"
        choices = "[...document.querySelectorAll('#metric-choice button')].map(b => b.textContent)"
        assert chromium.evaluate(choices) == [f"server.{MARKUP}", "evaluate.mean", "train.loss"]
        assert chromium.evaluate("document.querySelectorAll('#main img').length") == 0
        assert chromium.evaluate("window.pwned === undefined")
        # A token the link refuses: the page asks for one again.
        chromium.open("about:blank")
        chromium.open(f"{address}#token=not-the-token")
        refused = page_once(look, lambda state: state["asking"])
        assert not refused["listed"]
        error = chromium.evaluate("document.getElementById('login-error').textContent")
        assert error.startswith("The link refused the token")
