"""A stand-in for torchvision: the image transforms Flower's examples use, and nothing else.

PyPI's torchvision builds do not import beside the CPU build of torch the tests
install, so the tests put this package first on ``PYTHONPATH`` instead
(tests/flower_apps/README.md). :mod:`torchvision.transforms` holds the five
transforms the examples compose; it is fedcore's test code, not torchvision's.
"""
