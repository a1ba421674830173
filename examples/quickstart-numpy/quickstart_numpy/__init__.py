"""fedcore quickstart: multinomial logistic regression on scikit-learn's digits."""
