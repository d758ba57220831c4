"""The run directory: its paths and lock, atomic writes, preemption and interrupts."""
