"""``kernel_code.norm_finish`` gives the float32 bits of torch's 2-norm of a row on the CPU
(``torch.linalg.vector_norm(row, dim=-1)``, as SLERP's and Model Stock's whole-tensor norms take it), so those
norms can be formed from the stored bits block by block: every tail length (the last n mod 8 elements, added
four as a vector and the rest fused), short rows without a whole vector, long rows, tiny and huge values, zeros,
with torch's threads as this process has them and at 1 in a fresh process. The reference is torch itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ram_desktop.core.engine import kernels
from ram_desktop.core.engine.kernel_code import NORM_LANES, norm_finish
from tests.conftest import run_with_torch_threads


def _parts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lanes and tail ``norm_finish`` takes, formed element by element in index order."""
    n = values.size
    lanes, tail = np.zeros(NORM_LANES, np.float32), np.zeros(NORM_LANES, np.float32)
    whole = n - n % NORM_LANES
    for e in range(whole):
        lanes[e % NORM_LANES] = np.float32(lanes[e % NORM_LANES] + np.float32(values[e] * values[e]))
    tail[: n - whole] = values[whole:]
    return lanes, tail


@pytest.mark.parametrize("n", [*range(2, 41), 1000, 4099, 65_543])
def test_norm_parts_give_torch_norm(torch_threads, n):
    rng = np.random.default_rng(n)
    for scale in (3.0, 1e-21, 1e19, 0.02):
        values = (rng.standard_normal(n) * scale).astype(np.float32)
        if n > 8:
            values[rng.random(n) < 0.3] = 0
        lanes, tail = _parts(values)
        want = float(torch.linalg.vector_norm(torch.from_numpy(values), dim=-1))
        assert float(norm_finish(n, lanes, tail)) == want, (n, scale)
        assert float(torch.norm(torch.from_numpy(values).reshape(1, -1), dim=-1)[0]) == want


def test_exactness_is_checked_here():
    assert kernels.torch_norm_exact()


def test_one_thread_in_a_fresh_process():
    """With torch on one thread the emulation still gives torch's norm (its row kernel runs on one thread)."""
    run_with_torch_threads(
        1,
        "import numpy as np\n"
        "from ram_desktop.core.engine import kernels\n"
        "from ram_desktop.core.engine.kernel_code import stored_norm\n"
        "assert kernels.torch_norm_exact()\n"
        "for n in (5, 13, 4099):\n"
        "    v = (np.random.default_rng(n).standard_normal(n) * 3).astype(np.float32)\n"
        "    assert float(stored_norm(v)) == float(torch.linalg.vector_norm(torch.from_numpy(v), dim=-1)), n\n",
    )


@pytest.mark.parametrize("stored", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("n", [*range(2, 41), 4099, 65_543])
def test_the_compiled_norm_of_stored_bits_and_offsets_is_torchs(stored, n):
    """``stored_norm`` and ``norm_parts`` (compiled with the SLP vectoriser) from the stored bits of a row, and of
    its offset from a base, against torch's norm of the same row widened to float32 (and subtracted) by torch."""
    from ram_desktop.core.engine.kernel_code import norm_parts, stored_norm

    rng = np.random.default_rng(n)
    dtype = getattr(torch, stored)
    for scale in (3.0, 0.02, 1e-3):
        values, base = (torch.from_numpy(rng.standard_normal((2, n)) * scale).to(dtype)).unbind(0)
        # as the engine hands them over: bfloat16 bits as uint16, float16 bits as int16, float32 as floats
        bits = [
            t.view(torch.int16).numpy().view(np.uint16)
            if stored == "bfloat16"
            else t.view(torch.int16).numpy()
            if stored == "float16"
            else t.numpy()
            for t in (values, base)
        ]
        want = float(torch.linalg.vector_norm(values.float(), dim=-1))
        assert float(stored_norm(bits[0])) == want, (n, scale)
        lanes, tail = np.zeros(NORM_LANES, np.float32), np.zeros(NORM_LANES, np.float32)
        assert norm_parts(bits[0], bits[1], lanes, tail) == 0
        want = float(torch.linalg.vector_norm(values.float() - base.float(), dim=-1))
        assert float(norm_finish(n, lanes, tail)) == want, (n, scale)


def test_norm_parts_says_when_an_offset_may_not_be_finite():
    """0 only when every offset is surely finite; 1 for an infinite or NaN offset anywhere (a lane or the tail),
    and for finite offsets whose squares overflow (the caller then checks the offsets themselves)."""
    from ram_desktop.core.engine.kernel_code import norm_parts

    def flag(values: np.ndarray, base: np.ndarray) -> int:
        lanes, tail = np.zeros(NORM_LANES, np.float32), np.zeros(NORM_LANES, np.float32)
        return int(norm_parts(values, base, lanes, tail))

    base = np.zeros(101, np.float32)
    values = np.random.default_rng(0).standard_normal(101).astype(np.float32)
    assert flag(values, base) == 0
    for where in (0, 37, 95, 100):  # in a lane, and in the tail (101 = 12 · 8 + 5)
        for bad in (np.inf, -np.inf, np.nan):
            broken = values.copy()
            broken[where] = bad
            assert flag(broken, base) == 1, (where, bad)
    huge = np.full(101, 1e30, np.float32)  # finite offsets, squares beyond float32
    assert flag(huge, base) == 1
    assert kernels.finite_taus(base, (huge,))
