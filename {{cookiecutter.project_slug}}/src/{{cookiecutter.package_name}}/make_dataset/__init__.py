"""Writing datasets: make-dataset's inputs (sources.py lists them) and the writer of each kind's
format, and the tokenizer trainer. A run never imports this folder: it sits above everything
training uses (docs/training.md, the layers), so reading a dataset cannot load a writer."""
