"""The one set of defaults shared by the merge spec (MergeSpec), the engine and the recipe file."""

from __future__ import annotations

METHOD = "ram-plus"
EPS = 1e-5
DEVICE = "auto"
OUT_DTYPE = "base"
SHARD_SIZE = "5GB"
VOCAB = "exact"
