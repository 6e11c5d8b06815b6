"""The one set of defaults shared by the merge spec (MergeSpec), the engine and the recipe file."""

from __future__ import annotations

METHOD = "ram-plus"
EPS = 1e-5
DEVICE = "auto"
OUT_DTYPE = "base"
SHARD_SIZE = "5GB"
VOCAB = "exact"
# `ram-merge search` without --methods: the paper's methods and baselines (Fisher needs calibration data)
SEARCH_METHODS = ("ram-plus", "ram", "average", "task-arithmetic", "ties", "dare-ta", "dare-ties")
