"""Training: the run built from its config, the step, evaluation during training, and the loop
that starts or resumes a run and stops it in time (the `train` command runs it; `benchmark` and
`evaluate` use its step and its evaluation)."""
