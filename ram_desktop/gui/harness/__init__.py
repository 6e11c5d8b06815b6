"""Test harnesses that drive the real window: the self-test and the soak. Not used by the window."""
