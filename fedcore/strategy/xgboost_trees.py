"""Tree bagging on XGBoost models as bytes: what FedXgbBagging aggregates with.

A node trains a few boosting rounds and replies with only its new trees, as an
XGBoost JSON model (``booster.save_raw("json")``, the booster sliced to its last
rounds) in a one-array ArrayRecord of uint8. Bagging appends each reply's trees to
the global model: their ids continue the global numbering, their ``tree_info``
(the output group each tree feeds) comes along, and each boosting round they hold
becomes one more round of the global model (``iteration_indptr``), so the global
model predicts the sum of every node's trees. Everything else — objective, base
score, features — stays the global model's, which is the first reply's when the
global model is still empty.

Plain JSON: the server needs no xgboost installed (the ClientApps do:
``pip install fedcore[xgboost]``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fedcore.domain import ArrayRecord

MODEL_KEY = "0"
"""The array an XGBoost ArrayRecord's model bytes are stored under (Flower's)."""


def model_bytes(arrays: ArrayRecord) -> bytes:
    """The model bytes in a one-array ArrayRecord (``ValueError`` for any other)."""
    if len(arrays) != 1:
        raise ValueError(
            f"an XGBoost ArrayRecord holds one array of model bytes, found {len(arrays)}"
        )
    (array,) = arrays.values()
    return np.ascontiguousarray(array).tobytes()


def model_record(model: bytes) -> ArrayRecord:
    """``model`` as a one-array ArrayRecord of uint8, as nodes send it."""
    return ArrayRecord({MODEL_KEY: np.frombuffer(model, dtype=np.uint8)})


def bag(global_model: bytes, reply_model: bytes) -> bytes:
    """``global_model`` with the trees of ``reply_model`` appended (``reply_model`` itself
    when the global model is empty). ``ValueError`` for bytes that are not an XGBoost
    JSON tree model."""
    if not global_model:
        _trees(_load(reply_model))  # checked, then taken as it is
        return reply_model
    merged, incoming = _load(global_model), _load(reply_model)
    into, new = _trees(merged), _trees(incoming)
    offset = int(into["gbtree_model_param"]["num_trees"])
    for index, tree in enumerate(new["trees"]):
        into["trees"].append({**tree, "id": offset + index})
    into["tree_info"].extend(new["tree_info"])
    last = into["iteration_indptr"][-1]
    into["iteration_indptr"].extend(last + end for end in new["iteration_indptr"][1:])
    into["gbtree_model_param"]["num_trees"] = str(offset + len(new["trees"]))
    return json.dumps(merged).encode()


def _load(model: bytes) -> Any:
    try:
        return json.loads(model)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not an XGBoost JSON model: {exc}") from None


def _trees(model: Any) -> Any:
    """The ``gbtree`` part of a loaded model, checked to have what bagging edits."""
    try:
        trees = model["learner"]["gradient_booster"]["model"]
    except (KeyError, TypeError):
        raise ValueError(
            "not an XGBoost JSON tree model: no learner.gradient_booster.model"
        ) from None
    missing = [key for key in _EDITED if not isinstance(trees, dict) or key not in trees]
    if missing:
        raise ValueError(f"not an XGBoost JSON tree model: no {', '.join(missing)}")
    return trees


_EDITED = ("gbtree_model_param", "trees", "tree_info", "iteration_indptr")
