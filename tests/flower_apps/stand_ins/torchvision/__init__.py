"""A stand-in for torchvision: the image transforms and the one data set Flower's apps use.

PyPI's torchvision builds do not import beside the CPU build of torch the tests
install, so the tests put this package first on ``PYTHONPATH`` instead
(tests/flower_apps/README.md). :mod:`torchvision.transforms` holds the transforms the
examples compose, :mod:`torchvision.datasets` a synthetic CIFAR-10 for Flower's e2e
apps; it is fedcore's test code, not torchvision's.
"""
