"""``kernels.TorchSum`` gives ``torch.sum``'s float32 bits for a tensor fed in slices of any size (the whole-tensor
sums of the streamed whole-tensor methods, e.g. DELLA's L1 rescale): sizes that take every branch of torch's
cascade (a scalar tail, a partial row of vectors, several level blocks, two threads' parts), values and their
absolute values, with torch's threads at 1 and at 2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ram_desktop.core.engine.kernels import TorchSum

SIZES = [8, 9, 31, 33, 100, 4097, 32767, 32768, 32769, 65537, (1 << 20) + 5, 3_000_001]


@pytest.mark.parametrize("n", SIZES)
def test_streamed_sum_is_torch_sum(torch_threads, n):
    rng = np.random.default_rng(n)
    values = (rng.standard_normal(n) * rng.uniform(0.01, 100)).astype(np.float32)
    for absolute in (False, True):
        reference = torch.from_numpy(values)
        want = float((reference.abs() if absolute else reference).sum())
        for feed in (n, 65_536, 99_991) if n > 100_000 else (n, 7, 4096):
            summed = TorchSum(n, absolute)
            for start in range(0, n, feed):
                summed.feed(values[start : start + feed])
            assert summed.result() == want, (n, absolute, feed)


def test_exactness_is_checked_here(torch_threads):
    assert TorchSum.exact()
