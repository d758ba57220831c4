"""What a run reports: metrics, console lines, trackers, profiles, plots."""
