"""The Evaluate and Compare steps: suites, the run bar, the scores table and chart."""
