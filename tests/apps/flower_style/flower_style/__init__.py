"""A Flower app, as Flower's own examples are written, that fedcore runs unchanged."""
