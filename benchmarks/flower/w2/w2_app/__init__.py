"""W2 as a Flower app: the orchestration benchmark, where the model is tiny and the time
is the framework's own — one message out and one reply back per node per round."""
