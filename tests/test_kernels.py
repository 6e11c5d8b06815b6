"""The fast chunk kernels equal the plain formulations bit for bit, signed zeros included."""

from __future__ import annotations

import pytest
import torch

from ram_desktop.core.engine.chunks import Chunk, Workspace
from ram_desktop.core.methods.ram import _selective_merge_masks, selective_merge


def _tricky(n_agents: int, n: int = 4096, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = (0.02 * torch.randn(n, generator=g)).to(torch.bfloat16).float()
    base[::7] = -0.0  # negative zeros in the base
    base[1::7] = 0.0
    taus = torch.empty(n_agents, n)
    for t in range(n_agents):
        kind = torch.randint(0, 5, (n,), generator=g)
        taus[t] = torch.where(
            kind == 0,
            0.0,
            torch.where(kind == 1, -3e-6, torch.where(kind == 2, 2e-6, 0.001 * torch.randn(n, generator=g))),
        )
        taus[t, 3::11] = -taus[0, 3::11] if t else taus[t, 3::11]  # cancelling pairs
    return base, taus


@pytest.mark.parametrize("n_agents", [1, 2, 3, 5])
@pytest.mark.parametrize("lambdas", [None, "plus"])
def test_selective_merge_matches_plain_formulation(n_agents, lambdas):
    base, taus = _tricky(n_agents)
    lams = None if lambdas is None else [1.0 + 0.07 * (t + 1) for t in range(n_agents)]
    ws = Workspace()
    fast = selective_merge(Chunk(0, "w", 0, base, taus, 1e-5, workspace=ws), lams)
    plain = _selective_merge_masks(Chunk(0, "w", 0, base, taus, 1e-5), lams)
    assert torch.equal(fast, plain)
    assert torch.equal(torch.signbit(fast), torch.signbit(plain))
    theta_fast = base + fast
    theta_plain = base + plain
    assert torch.equal(torch.signbit(theta_fast), torch.signbit(theta_plain))
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        out = torch.empty(base.shape, dtype=dtype)
        torch.add(base, fast, out=out)
        assert torch.equal(
            out.view(torch.int16 if dtype != torch.float32 else torch.int32),
            theta_plain.to(dtype).view(torch.int16 if dtype != torch.float32 else torch.int32),
        )
