"""A stand-in ``torch`` package for the compute set-up tests: built into a real wheel with ``pip wheel`` (``uv``
installs it offline from a local folder, and the runtime check imports it in a child process), or laid out
by hand as an installed runtime folder with its marker (a folder a test then damages)."""

from __future__ import annotations

import json
import os
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


LIB = bytes(range(256)) * 16  # torch/lib/libtorch_fake.so: 4096 bytes


def torch_source(cuda: str | None = None, warn: str = "", broken: bool = False, first: str = "") -> str:
    """The stand-in's ``__init__.py``; ``first``: statements it runs before anything else."""
    code = FAKE_TORCH.replace("CUDA", repr(cuda)).replace("WARN", repr(warn))
    code = code.replace(
        "BROKEN", "raise ImportError('libtorch_fake.so: cannot open shared object file')" if broken else ""
    )
    return first + code


def build_wheel(where: Path, cuda: str | None = None, warn: str = "", broken: bool = False, first: str = "") -> Path:
    """A wheelhouse holding ``torch-2.13.0+fake``: built from source with ``pip wheel``."""
    src = where / "src"
    (src / "torch" / "lib").mkdir(parents=True)
    (src / "torch" / "__init__.py").write_text(torch_source(cuda, warn, broken, first))
    (src / "torch" / "lib" / "libtorch_fake.so").write_bytes(LIB)
    (src / "pyproject.toml").write_text(
        textwrap.dedent("""\
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
        """)
    )
    house = where / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(house),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert len(list(house.glob("torch-2.13.0+fake-*.whl"))) == 1
    return house


def runtime_folder(runtimes: Path, init: str | None = None, **marker_fields: object) -> Path:
    """``runtimes/cpu-torch2.13.0`` as an install leaves it (``site/torch``, the marker), chosen in
    ``runtimes/active``, but never checked (no verdict kept): ``init`` is torch's ``__init__.py`` (default:
    the working stand-in), ``marker_fields`` replace the marker's."""
    folder = runtimes / "cpu-torch2.13.0"
    (folder / "site" / "torch" / "lib").mkdir(parents=True)
    (folder / "site" / "torch" / "__init__.py").write_text(torch_source() if init is None else init)
    (folder / "site" / "torch" / "lib" / "libtorch_fake.so").write_bytes(LIB)
    marker = {
        "format": "ram-runtime/1",
        "variant": "cpu",
        "build": None,
        "torch": "2.13.0+fake",
        "cuda": None,
        "hip": None,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "source": None,
        "lock": None,
        "installed": "2026-11-27T00:00:00",
        "verified": {"ok": True},
        "modules": ["torch"],
        "binaries": {"torch/lib/libtorch_fake.so": len(LIB)},
    }
    marker.update(marker_fields)
    (folder / "runtime.json").write_text(json.dumps(marker, indent=1))
    (runtimes / "active").write_text(folder.name + "\n")
    return folder


def hanging(pid_file: Path) -> str:
    """Statements for ``first``: torch writes the pid of the process importing it to ``pid_file``, then hangs."""
    return (
        f"import os as _os, time as _time\nopen({str(pid_file)!r}, 'w').write(str(_os.getpid()))\n_time.sleep(3600)\n"
    )


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z"
