"""W3 as a Flower app: fedcore's quickstart-numpy task (examples/quickstart-numpy) written
against Flower's API, with nothing of fedcore in it, so Flower's simulation can run it."""
