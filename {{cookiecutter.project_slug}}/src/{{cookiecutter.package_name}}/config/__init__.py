"""Configuration: the keys of a run, config files, the rules for resuming."""
