"""Flower's legacy ``flwr.server.strategy.aggregate`` functions, on fedcore's rules.

Each function takes Flower's arguments (lists of ``NDArrays``, ``(NDArrays,
num_examples)`` pairs, ``(ClientProxy, FitRes)`` pairs) and computes with the rule
of :mod:`fedcore.strategy.aggregate` or :mod:`fedcore.strategy.optimizers` that the
Message-API strategies use, so the legacy strategies and fedcore's own aggregate
alike. The clients' lists of arrays become ArrayRecords (keys ``"0"``, ``"1"``, …),
each layer in the dtype numpy's arithmetic would give all the clients' layers
together, as Flower's arithmetic on them does.

Where the result differs from Flower's (docs/from-flower.md, "Legacy strategies"):
fedcore's rules return each layer in its own dtype — an integer layer (a batch-norm
counter) comes back rounded to an integer where Flower's division makes it float64 —
and they sum in float64, so float32 results can differ from Flower's in the last bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedcore.domain import ArrayRecord, MetricRecord
from fedcore.domain.array import NDArray, NDArrays
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.types import FitRes, parameters_to_ndarrays
from fedcore.strategy import aggregate as rules
from fedcore.strategy.optimizers import qffl_apply


def records(models: Sequence[NDArrays]) -> list[ArrayRecord]:
    """Each client's arrays as an ArrayRecord, each layer promoted to the dtype numpy
    gives all the clients' versions of it; ``ValueError`` if their lengths differ."""
    if not models:
        raise ValueError("nothing to aggregate")
    count = len(models[0])
    if any(len(model) != count for model in models):
        raise ValueError(f"the clients' models differ in length: {[len(m) for m in models]}")
    dtypes = [np.result_type(*(model[layer] for model in models)) for layer in range(count)]
    return [
        ArrayRecord(
            {str(layer): np.asarray(model[layer], dtype=dtypes[layer]) for layer in range(count)}
        )
        for model in models
    ]


def ndarrays(record: ArrayRecord) -> NDArrays:
    """The arrays of ``record``, in order, as plain ndarrays."""
    return [np.asarray(array) for array in record.values()]


def aggregate(results: list[tuple[NDArrays, int]]) -> NDArrays:
    """The mean of the clients' models weighted by their number of examples (FedAvg)."""
    models = records([weights for weights, _ in results])
    return ndarrays(rules.weighted_average_arrays(models, [count for _, count in results]))


def aggregate_inplace(results: list[tuple[ClientProxy, FitRes]]) -> NDArrays:
    """:func:`aggregate` of the ``FitRes``, decoded and folded in one at a time, so
    that one client's model is held at once besides the sum (Flower's ``inplace``).
    Later clients' layers are cast to the first client's dtypes, as Flower's in-place
    arithmetic casts them."""
    mean = rules.ArrayMean()
    first: list[np.dtype[Any]] = []
    for _, fit_res in results:
        model = parameters_to_ndarrays(fit_res.parameters)
        if not first:
            first = [layer.dtype for layer in model]
        if len(model) != len(first):
            raise ValueError(f"a client's model has {len(model)} arrays, the first's {len(first)}")
        record = ArrayRecord(
            {
                str(i): np.asarray(layer, dtype=dtype)
                for i, (layer, dtype) in enumerate(zip(model, first, strict=True))
            }
        )
        mean.add(record, fit_res.num_examples)
    return ndarrays(mean.result())


def weighted_loss_avg(results: list[tuple[int, float]]) -> float:
    """The clients' losses averaged, weighted by their number of examples."""
    losses = [MetricRecord({"loss": float(loss)}) for _, loss in results]
    mean = rules.weighted_average_metrics(losses, [count for count, _ in results])
    if "loss" not in mean:
        raise ValueError("the clients' numbers of examples sum to nothing")
    return float(mean["loss"])  # type: ignore[arg-type]


def aggregate_median(results: list[tuple[NDArrays, int]]) -> NDArrays:
    """The coordinate-wise median of the clients' models (FedMedian)."""
    return ndarrays(rules.coordinate_median(records([weights for weights, _ in results])))


def aggregate_trimmed_avg(results: list[tuple[NDArrays, int]], proportiontocut: float) -> NDArrays:
    """The coordinate-wise trimmed mean of the clients' models (FedTrimmedAvg)."""
    models = records([weights for weights, _ in results])
    return ndarrays(rules.trimmed_mean(models, proportiontocut))


def aggregate_krum(
    results: list[tuple[NDArrays, int]], num_malicious: int, to_keep: int
) -> NDArrays:
    """Krum's choice among the clients' models, or with ``to_keep > 0`` the
    example-weighted mean of the ``to_keep`` best (Multi-Krum)."""
    models = records([weights for weights, _ in results])
    picked = rules.krum_select(models, num_malicious, max(to_keep, 1))
    if to_keep > 0:
        return aggregate([results[index] for index in picked])
    return results[picked[0]][0]


def aggregate_bulyan(
    results: list[tuple[NDArrays, int]],
    num_malicious: int,
    aggregation_rule: Callable[..., NDArrays],
    **aggregation_rule_kwargs: Any,
) -> NDArrays:
    """Bulyan: ``n − 2f`` models picked by repeated Krum, then the coordinate-wise mean
    of the ``n − 4f`` values of them closest to their median.

    As Flower's, ``aggregation_rule`` must be :func:`aggregate_krum` (the one Byzantine-
    resilient rule offered), and Bulyan needs ``n ≥ 4f + 3`` models. Unlike Flower's,
    ``results`` is left as given (Flower's removes the picked models from it).
    """
    if len(results) < 4 * num_malicious + 3:
        raise ValueError(
            "Bulyan needs at least 4 * num_malicious + 3 clients "
            f"({4 * num_malicious + 3}), got {len(results)}"
        )
    if aggregation_rule is not aggregate_krum or aggregation_rule_kwargs.get("to_keep", 0) > 0:
        raise ValueError("Bulyan's aggregation rule must be aggregate_krum (single model)")
    models = records([weights for weights, _ in results])
    theta = len(results) - 2 * num_malicious
    picked = rules.iterative_krum_select(models, num_malicious, theta)
    selected = [models[index] for index in picked]
    return ndarrays(rules.mean_around_median(selected, theta - 2 * num_malicious))


def aggregate_qffl(
    parameters: NDArrays, deltas: list[NDArrays], hs_fll: list[NDArrays]
) -> NDArrays:
    """The q-FFL step: ``parameters − Σ deltas / Σ hs_fll`` (q-FedAvg)."""
    current = {str(i): np.asarray(layer) for i, layer in enumerate(parameters)}
    sums = {key: np.zeros(array.shape, dtype=np.float64) for key, array in current.items()}
    for delta in deltas:
        for key, layer in zip(current, delta, strict=True):
            sums[key] += layer
    h_total = float(np.sum(np.asarray(hs_fll)))
    return list(qffl_apply(current, sums, h_total).values())


def _compute_distances(weights: list[NDArrays]) -> NDArray:
    """The matrix of squared distances between the clients' models."""
    return rules.squared_distances(records(weights))


def _trim_mean(array: NDArray, proportiontocut: float) -> NDArray:
    """The trimmed mean of ``array`` along its first axis."""
    rows = [ArrayRecord({"0": row}) for row in np.asarray(array)]
    return np.asarray(rules.trimmed_mean(rows, proportiontocut)["0"])


def _check_weights_equality(weights1: NDArrays, weights2: NDArrays) -> bool:
    """Whether two models have the same arrays."""
    return len(weights1) == len(weights2) and all(
        np.array_equal(a, b) for a, b in zip(weights1, weights2, strict=True)
    )


def _find_reference_weights(reference_weights: NDArrays, list_of_weights: list[NDArrays]) -> int:
    """The index of ``reference_weights`` in ``list_of_weights``; ``ValueError`` if absent."""
    for index, weights in enumerate(list_of_weights):
        if _check_weights_equality(reference_weights, weights):
            return index
    raise ValueError("The reference weights not found in list_of_weights.")


def _aggregate_n_closest_weights(
    reference_weights: NDArrays, results: list[tuple[NDArrays, int]], beta_closest: int
) -> NDArrays:
    """The coordinate-wise mean of the ``beta_closest`` values closest to the reference's."""
    reference, *models = records([reference_weights, *(weights for weights, _ in results)])
    return ndarrays(rules.mean_closest_to(reference, models, beta_closest))
