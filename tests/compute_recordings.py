"""Outputs of ``nvidia-smi`` and ``rocminfo`` for the detection tests, and a fake-executable helper.

``H100_580_*`` were recorded on an NVIDIA H100 machine (driver 580.159.04, 2026-11-25), byte for byte. The
others were written here after the same tools' formats, for drivers and failures no machine here has (the
535 / 470 headers in nvidia-smi's layout of those driver series; the failures with nvidia-smi's own messages
and exit codes; rocminfo's agent list): they are not recordings.
"""

from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path

import pytest

H100_580_QUERY = "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\n"
H100_580_HEADER = (  # nvidia-smi, verbatim (trailing spaces included)
    "Wed Nov 25 13:06:14 2026       \n"
    "+-----------------------------------------------------------------------------------------+\n"
    "| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |\n"
    "+-----------------------------------------+------------------------+----------------------+\n"
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n"
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n"
    "|                                         |                        |               MIG M. |\n"
    "|=========================================+========================+======================|\n"
    "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:06.0 Off |                    0 |\n"
    "| N/A   45C    P0             77W /  700W |       0MiB /  81559MiB |      0%      Default |\n"
    "|                                         |                        |             Disabled |\n"
    "+-----------------------------------------+------------------------+----------------------+\n"
    "\n"
    "+-----------------------------------------------------------------------------------------+\n"
    "| Processes:                                                                              |\n"
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n"
    "|        ID   ID                                                               Usage      |\n"
    "|=========================================================================================|\n"
    "|  No running processes found                                                             |\n"
    "+-----------------------------------------------------------------------------------------+\n"
)

RTX_535_QUERY = "NVIDIA GeForce RTX 3090, 24576 MiB, 535.183.01\nNVIDIA GeForce RTX 3090, 24576 MiB, 535.183.01\n"
RTX_535_HEADER = """\
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.183.01             Driver Version: 535.183.01   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
"""

TESLA_470_QUERY = "Tesla V100-SXM2-16GB, 16160 MiB, 470.256.02\n"
TESLA_470_HEADER = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 470.256.02   Driver Version: 470.256.02   CUDA Version: 11.4     |
|-------------------------------+----------------------+----------------------+
"""

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
    "the latest NVIDIA driver is installed and running.\n\n"
)  # exit 9
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n"  # exit 18
GARBAGE = "\x00\x13garbage output ### not csv\n"

ROCMINFO_7900 = """\
ROCk module version 6.10.5 is loaded
=====================
HSA System Attributes
=====================
Runtime Version:         1.15
System Timestamp Freq.:  1000.000000MHz
==========
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD Ryzen 9 7950X 16-Core Processor
  Uuid:                    CPU-XX
  Marketing Name:          AMD Ryzen 9 7950X 16-Core Processor
  Vendor Name:             CPU
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx1100
  Uuid:                    GPU-8f3c2a1b9d4e5f60
  Marketing Name:          Radeon RX 7900 XTX
  Vendor Name:             AMD
  Device Type:             GPU
*** Done ***
"""


def fake_program(folder: Path, name: str, outputs: dict[str, tuple[int, str]]) -> Path:
    """An executable ``folder/name`` that prints ``outputs[key][1]`` and exits ``outputs[key][0]``, where
    ``key`` is "query" when it is called with ``--query-gpu=...`` and "plain" otherwise."""
    if sys.platform.startswith("win"):
        pytest.skip("the fake programs are POSIX shell scripts")
    folder.mkdir(parents=True, exist_ok=True)
    for key, (_code, text) in outputs.items():
        (folder / f"{name}.{key}.out").write_text(text, encoding="utf-8")
    cat = shutil.which("cat") or "/bin/cat"
    lines = ["#!/bin/sh", 'case "$1" in']
    for key, pattern in (("query", "--query-gpu=*"), ("plain", "*")):
        if key in outputs:
            lines.append(f'  {pattern}) {cat} "{folder}/{name}.{key}.out"; exit {outputs[key][0]};;')
    lines += ["esac", "exit 0"]
    program = folder / name
    program.write_text("\n".join(lines) + "\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return program


def path_with(folder: Path) -> str:
    """A PATH holding only ``folder`` (the fake programs call ``cat`` by its full path)."""
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)
