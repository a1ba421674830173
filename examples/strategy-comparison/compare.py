"""Race strategies on one non-IID split of the digits, with a third of the nodes 10× slower.

    python compare.py                       # FedAvg, FedProx, FedAdam, FedBuff
    python compare.py fedavg krum --rounds 20

Every strategy gets the same nodes, the same Dirichlet(0.5) split and the same node
speeds (a seeded third of the nodes sleep ten times longer after training). For each
it prints the final server accuracy, and the round and wall time at which the server's
accuracy first reached the target. FedBuff's rounds are server steps, each made from as
many replies as a FedAvg round, but from replies to older models (stale ones count
less), so compare the seconds rather than the rounds.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import fedcore as fc

HERE = Path(__file__).resolve().parent
RACE = {"base-delay": 0.05, "slow-fraction": 1 / 3, "slow-factor": 10.0}


@dataclass(frozen=True)
class Point:
    """A finished round: when (seconds since the start), which, and the server's accuracy."""

    seconds: float
    server_round: int
    accuracy: float


@dataclass
class Run:
    """One strategy's run: its accuracy after every round, and its total wall time."""

    strategy: str
    curve: list[Point]
    seconds: float

    @property
    def final_accuracy(self) -> float:
        return self.curve[-1].accuracy

    def reached(self, target: float) -> Point | None:
        """The first round whose accuracy reached ``target``, if any did."""
        return next((point for point in self.curve if point.accuracy >= target), None)


class _Stopwatch(logging.Handler):
    """Notes when each finished round's report is logged."""

    def __init__(self, started: float) -> None:
        super().__init__()
        self.started = started
        self.curve: list[Point] = []

    def emit(self, record: logging.LogRecord) -> None:
        report = getattr(record, "fedcore_round", None)
        if report is not None:
            accuracy = float(report.server_metrics["accuracy"])
            self.curve.append(Point(time.monotonic() - self.started, report.server_round, accuracy))


def race(strategy: str, *, nodes: int, rounds: int, seed: int = 0) -> Run:
    """One simulated run of ``strategy`` with the slow nodes of :data:`RACE`."""
    stopwatch = _Stopwatch(time.monotonic())
    logger = logging.getLogger("fedcore.strategy")
    logger.addHandler(stopwatch)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        fc.run_simulation(
            HERE,
            nodes=nodes,
            backend="inline",
            seed=seed,
            run_config={"strategy": strategy, "num-server-rounds": rounds, **RACE},
            progress=False,  # the comparison prints its own table
        )
    finally:
        logger.removeHandler(stopwatch)
        logger.setLevel(level)
    return Run(strategy, stopwatch.curve, time.monotonic() - stopwatch.started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "strategies", nargs="*", default=["fedavg", "fedprox", "fedadam", "fedbuff"]
    )
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--target", type=float, default=0.70)
    args = parser.parse_args()
    reached = f"@{args.target:g}"
    print(
        f"{'strategy':<14}{'final acc':>10}{'round' + reached:>12}{'s' + reached:>10}{'total s':>9}"
    )
    for name in args.strategies:
        row = race(name, nodes=args.nodes, rounds=args.rounds)
        point = row.reached(args.target)
        at_round = "-" if point is None else str(point.server_round)
        at_time = "-" if point is None else f"{point.seconds:.2f}"
        print(
            f"{name:<14}{row.final_accuracy:>10.3f}{at_round:>12}{at_time:>10}{row.seconds:>9.2f}"
        )


if __name__ == "__main__":
    main()
