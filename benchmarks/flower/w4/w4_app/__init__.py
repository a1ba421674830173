"""W4 as a Flower app: real compute, the training of benchmarks/w4.py written against
Flower's API, so that the time is the ClientApps' BLAS matmuls and the frameworks'
share is what they add around them."""
