"""RAM Desktop: merge reinforcement-learning-trained agents with RAM / RAM+ and baselines."""

__version__ = "0.1.0"
