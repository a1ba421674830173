"""The deployment benchmarks' app: nodes echo the model back; the server times each round."""
