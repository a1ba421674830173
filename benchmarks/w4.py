"""W4: real compute — a 2-layer MLP trained with numpy on the digits, on the process backend.

100 nodes, 20 per round, 10 rounds, 2 local epochs of minibatch SGD (batches of 32)
on a 64-1024-10 ReLU network: the time is the ClientApps' BLAS matmuls, not
fedcore's. The digits' 1,437 training images split 100 ways would leave 14 per node,
too few to compute anything, so each node holds its own draw of
:data:`SAMPLES` of them (seeded by its id).

The variants differ only in the thread variables the simulation is started with
(``benchmarks.run`` sets them before anything loads numpy): ``capped`` sets none, so
fedcore caps each worker at its share (1 thread); ``uncapped`` sets them to the
machine's cores, as a user who chose so would, and fedcore keeps them. ``floor`` is
the same training serially in one process at one thread, without orchestration; the
ideal for the pool is that ÷ its workers. Those run in the benchmark's process; the
``-cli`` variants run each as a whole process, as a user does (:func:`cli`).
``benchmarks.w4_torch`` is the same in torch.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

import fedcore as fc
from fedcore.simulation.resources import Resources
from fedcore.strategy import FedAvg
from fedcore.testing.deployment import FEDCORE
from fedcore.workers.sizing import plan_pool

ROOT = Path(__file__).resolve().parent.parent
NODES, PER_ROUND, ROUNDS, EPOCHS = 100, 20, 10, 2
SAMPLES, HIDDEN, BATCH, LR = 256, 1024, 32, 0.05
Arrays = dict[str, np.ndarray]


@lru_cache(maxsize=1)
def digits() -> tuple[np.ndarray, np.ndarray]:
    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target


def local_data(partition: int) -> tuple[np.ndarray, np.ndarray]:
    """The node's own draw of the digits: the same in every process."""
    x, y = digits()
    chosen = np.random.default_rng([4, partition]).choice(len(x), SAMPLES, replace=False)
    return x[chosen], y[chosen]


def initial_model() -> Arrays:
    rng = np.random.default_rng(0)
    return {
        "w1": (rng.standard_normal((64, HIDDEN)) * np.sqrt(2 / 64)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.standard_normal((HIDDEN, 10)) * np.sqrt(1 / HIDDEN)).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }


def train(model: Arrays, partition: int, server_round: int) -> Arrays:
    """``EPOCHS`` of SGD on the node's data; the new model."""
    x, y = local_data(partition)
    m = {name: array.copy() for name, array in model.items()}
    rng = np.random.default_rng([partition, server_round])
    for _ in range(EPOCHS):
        order = rng.permutation(len(x))
        for start in range(0, len(x), BATCH):
            xb, yb = x[order[start : start + BATCH]], y[order[start : start + BATCH]]
            hidden = np.maximum(xb @ m["w1"] + m["b1"], 0)
            logits = hidden @ m["w2"] + m["b2"]
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            probs[np.arange(len(yb)), yb] -= 1
            probs /= len(yb)
            back = (probs @ m["w2"].T) * (hidden > 0)
            m["w2"] -= LR * hidden.T @ probs
            m["b2"] -= LR * probs.sum(axis=0)
            m["w1"] -= LR * xb.T @ back
            m["b1"] -= LR * back.sum(axis=0)
    return m


def client_app(train: Callable[[Arrays, int, int], Arrays]) -> fc.ClientApp:
    """A ClientApp training with ``train(model, partition, server_round)``."""
    client = fc.ClientApp()

    @client.lifespan()
    def lifespan():  # type: ignore[no-untyped-def]
        digits()
        yield

    @client.train()
    def train_handler(msg: fc.Message, context: fc.Context) -> fc.Message:
        arrays = {name: np.array(array) for name, array in msg.content["arrays"].items()}
        server_round = msg.content["config"]["server-round"]
        model = train(arrays, context.node_config["partition-id"], server_round)
        metrics = fc.MetricRecord({"num-examples": SAMPLES})
        content = fc.RecordDict({"arrays": fc.ArrayRecord(model), "metrics": metrics})
        return fc.Message(content, reply_to=msg)

    return client


client = client_app(train)


def server_app(initial: Arrays) -> fc.ServerApp:
    """FedAvg over ``ROUNDS`` rounds; ``main`` returns the seconds the rounds took (the
    workers are up by then: their start-up is not in it)."""
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> float:
        strategy = FedAvg(
            fraction_train=PER_ROUND / NODES, fraction_evaluate=0.0, min_available_nodes=NODES
        )
        started = time.perf_counter()
        await strategy.start(grid=grid, initial_arrays=fc.ArrayRecord(initial), num_rounds=ROUNDS)
        return time.perf_counter() - started

    return server


app = fc.App(server=server_app(initial_model()), client=client)


def workers() -> int:
    """The process backend's pool size at its default resources."""
    return plan_pool(Resources()).workers


def run(variant: str, target: str = "benchmarks.w4:app") -> float:
    """``capped`` or ``uncapped``: the same simulation of the App at ``target`` (named, as
    a user names one; ``benchmarks.run`` set the threads); the seconds its rounds took."""
    seconds: float = fc.run_simulation(target, nodes=NODES, backend="process", seed=0).value
    return seconds


def cli(variant: str, module: str = "benchmarks.w4") -> None:
    """A ``-cli`` variant: the same as a user runs it, a whole process with its start-up.

    ``capped-cli`` and ``uncapped-cli`` are ``fedcore simulate MODULE:app``;
    ``floor-cli`` is a ``python -c`` of the serial training.
    """
    if variant == "floor-cli":
        command = [sys.executable, "-c", f"from {module} import floor; floor()"]
    else:
        command = [str(FEDCORE), "simulate", f"{module}:app", "--nodes", str(NODES)]
        command += ["--seed", "0", "-q"]
    subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)


def serial(train: Callable[[Arrays, int, int], Arrays], model: Arrays) -> None:
    """The same training serially in this process, with FedAvg's mean by hand."""
    rng = np.random.default_rng(0)
    for server_round in range(1, ROUNDS + 1):
        chosen = rng.choice(NODES, size=PER_ROUND, replace=False)
        updates = [train(model, int(p), server_round) for p in chosen]
        model = {name: np.mean([u[name] for u in updates], axis=0) for name in model}


def floor() -> None:
    serial(train, initial_model())
