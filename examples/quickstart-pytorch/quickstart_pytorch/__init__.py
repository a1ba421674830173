"""fedcore quickstart: a small PyTorch MLP on scikit-learn's digits."""
