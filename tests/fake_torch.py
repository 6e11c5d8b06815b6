"""A stand-in ``torch`` package built into a real wheel with ``pip wheel``, for the compute set-up tests:
``uv`` installs it offline from a local folder, and the runtime check imports it in a child process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

FAKE_TORCH = '''
"""A stand-in torch: enough for RAM Desktop's runtime check (random integers, a matrix product, equal)."""
import random as _random
import types as _types
import warnings as _warnings

__version__ = "2.13.0+fake"
version = _types.SimpleNamespace(cuda=CUDA, hip=None)
BROKEN


class _Cuda:
    @staticmethod
    def is_available():
        if WARN:
            _warnings.warn(WARN)
        return False


cuda = _Cuda()
backends = _types.SimpleNamespace(mps=_types.SimpleNamespace(is_available=lambda: False))


class Tensor:
    def __init__(self, rows):
        self.rows = rows

    def float(self):
        return Tensor([[float(x) for x in r] for r in self.rows])

    def to(self, device):
        return self

    def cpu(self):
        return self

    def __matmul__(self, other):
        cols = list(zip(*other.rows))
        return Tensor([[sum(a * b for a, b in zip(r, c)) for c in cols] for r in self.rows])


class Generator:
    def manual_seed(self, seed):
        self.rng = _random.Random(seed)
        return self


def randint(low, high, size, generator):
    return Tensor([[generator.rng.randrange(low, high) for _ in range(size[1])] for _ in range(size[0])])


def equal(a, b):
    return a.rows == b.rows
'''


def build_wheel(where: Path, cuda: str | None = None, warn: str = "", broken: bool = False) -> Path:
    """A wheelhouse holding ``torch-2.13.0+fake``: built from source with ``pip wheel``."""
    src = where / "src"
    (src / "torch" / "lib").mkdir(parents=True)
    code = FAKE_TORCH.replace("CUDA", repr(cuda)).replace("WARN", repr(warn))
    code = code.replace("BROKEN", "raise ImportError('libtorch_fake.so: cannot open shared object file')"
                        if broken else "")
    (src / "torch" / "__init__.py").write_text(code)
    (src / "torch" / "lib" / "libtorch_fake.so").write_bytes(bytes(range(256)) * 16)
    (src / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "torch"
        version = "2.13.0+fake"
        [tool.setuptools]
        packages = ["torch"]
        [tool.setuptools.package-data]
        torch = ["lib/*.so"]
        """))
    house = where / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(house), str(src)], check=True, capture_output=True, timeout=300)
    assert len(list(house.glob("torch-2.13.0+fake-*.whl"))) == 1
    return house
