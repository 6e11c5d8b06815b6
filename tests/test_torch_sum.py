"""``kernels.TorchSum`` gives ``torch.sum``'s float32 bits for a tensor fed in slices of any size (the whole-tensor
sums of the streamed whole-tensor methods, e.g. DELLA's L1 rescale): sizes that take every branch of torch's
cascade (a scalar tail, a partial row of vectors, several level blocks, two threads' parts), values and their
absolute values, with torch's threads as this process has them, and at 1 in a fresh process."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ram_desktop.core.engine.kernels import TorchSum
from tests.conftest import run_with_torch_threads

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


def test_one_thread_in_a_fresh_process():
    """With torch on one thread (one part instead of two) the emulation still gives torch.sum's bits."""
    run_with_torch_threads(
        1,
        "import numpy as np\n"
        "from ram_desktop.core.engine.kernels import TorchSum\n"
        "assert TorchSum.exact()\n"
        "for n in (8, 33, 65537, 3_000_001):\n"
        "    v = (np.random.default_rng(n).standard_normal(n) * 3).astype(np.float32)\n"
        "    s = TorchSum(n)\n"
        "    for a in range(0, n, 4096):\n"
        "        s.feed(v[a : a + 4096])\n"
        "    assert s.result() == float(torch.from_numpy(v).sum()), n\n",
    )
