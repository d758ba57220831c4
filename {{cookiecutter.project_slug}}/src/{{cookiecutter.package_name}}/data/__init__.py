"""Reading datasets: the kinds (one module each, kinds.py), batches as a function of the step,
input prefetch, and the directory format every kind shares (directory.py). Writing them is
make_dataset/'s."""
