"""Preflight checks of a node's environment and of the network between nodes."""
