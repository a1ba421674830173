"""A Flower-style custom strategy on fedcore, written as Flower's advanced-pytorch example
writes its ``CustomFedAvg``: a ``configure_train`` override with a learning-rate
schedule that calls ``super().configure_train(..., grid)``, and a ``start`` of its own
that drives the rounds through the Grid and calls ``self.summary()``. Only the imports
are fedcore's; the model is a numpy vector, so the test can compute the result."""
