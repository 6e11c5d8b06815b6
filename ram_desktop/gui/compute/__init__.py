"""The compute set-up: the status label, the first-start offer and the Settings > Compute page."""
