"""A stand-in for Hugging Face's ``datasets``: the names Flower's examples import, offline.

Flower's examples load their data from the Hugging Face hub, which the tests cannot
reach. The tests put this directory's parent first on ``PYTHONPATH`` of the processes
they start, so an example's ``from datasets import load_dataset`` gets this package:
small synthetic data sets under the hub's names, with the columns, dtypes and image
shapes the examples expect (:mod:`datasets.hub`), read the way the examples read them
(:mod:`datasets.dataset`). It is fedcore's test code, not a copy of ``datasets``,
and offers only what the examples in ``tests/flower_apps/README.md`` use.
"""

from datasets.dataset import Dataset, DatasetDict, concatenate_datasets
from datasets.hub import load_dataset

__all__ = ["Dataset", "DatasetDict", "concatenate_datasets", "load_dataset"]
