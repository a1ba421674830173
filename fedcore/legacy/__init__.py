"""Flower's legacy API (``NumPyClient``, ``client_fn``, ``flwr.server.strategy``,
``start_simulation``), translated onto fedcore's Message API.

Most published Flower code predates the Message API. This package gives it the
names and behaviour it expects, as a thin layer: a legacy client answers Messages,
a legacy ``Server`` drives rounds through a fedcore Grid, and each legacy strategy
aggregates with fedcore's own rules (:mod:`fedcore.strategy.aggregate`). Nothing
here is imported unless an app uses a legacy name.
"""
