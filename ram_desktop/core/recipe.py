"""``ram-recipe.yaml``: everything needed to reproduce a merge, written by every merge and run by
``ram-merge run`` and the GUI's File > Open recipe."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import defaults
from .errors import InputError

FORMAT = "ram-recipe/1"
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int) -> int:
    """'5GB' -> 5_000_000_000 (decimal, as Hugging Face uses), '2GiB' -> 2**31, plain ints are bytes."""
    if isinstance(text, int):
        value = text
    else:
        m = SIZE.match(str(text))
        if not m:
            raise InputError(f"cannot read size {text!r}; write it like 5GB, 500MB or 2GiB")
        value = int(float(m.group(1)) * UNITS[(m.group(2) or "B").upper()])
    if value <= 0:
        raise InputError(f"size {text!r} must be positive")
    return value


@dataclass
class Recipe:
    base: str
    agents: list[str]
    method: str = defaults.METHOD
    params: dict[str, Any] = field(default_factory=dict)
    names: list[str] | None = None
    eps: float = defaults.EPS
    out_dtype: str = defaults.OUT_DTYPE
    shard_size: str = defaults.SHARD_SIZE
    device: str = defaults.DEVICE
    out: str | None = None
    vocab: str = defaults.VOCAB  # "common": merge shared vocabulary rows (written only when not the default)

    def to_yaml(self) -> str:
        data = {
            "format": FORMAT,
            "method": self.method,
            "parameters": dict(self.params),
            "eps": self.eps,
            "base": self.base,
            "agents": [{"name": n, "source": s} if n else {"source": s}
                       for n, s in zip(self.names or [None] * len(self.agents), self.agents)],
            "out_dtype": self.out_dtype,
            "shard_size": self.shard_size,
            "device": self.device,
        }
        if self.vocab != defaults.VOCAB:
            data["vocab"] = self.vocab
        if self.out:
            data["output"] = self.out
        head = "# RAM Desktop merge recipe. Reproduce with: ram-merge run ram-recipe.yaml [--out DIR]\n"
        return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)

    def save(self, path: Path) -> None:
        path.write_text(self.to_yaml(), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> "Recipe":
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise InputError(f"{path}: cannot read recipe ({e.strerror})") from None
        except yaml.YAMLError as e:
            raise InputError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Any, where: str = "recipe") -> "Recipe":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f"{where}: not a RAM Desktop recipe (needs 'format: {FORMAT}')")
        try:
            agents = data["agents"]
            if not isinstance(agents, list):
                raise TypeError
            sources = [str(a["source"]) if isinstance(a, dict) else str(a) for a in agents]
            names = [a.get("name") for a in agents if isinstance(a, dict)]
            params = data.get("parameters") or {}
            if not isinstance(params, dict):
                raise TypeError
            return cls(
                base=str(data["base"]),
                agents=sources,
                method=str(data.get("method", defaults.METHOD)),
                params=params,
                names=[str(n) for n in names] if len(names) == len(sources) and all(names) else None,
                eps=float(data.get("eps", defaults.EPS)),
                out_dtype=str(data.get("out_dtype", defaults.OUT_DTYPE)),
                shard_size=str(data.get("shard_size", defaults.SHARD_SIZE)),
                device=str(data.get("device", defaults.DEVICE)),
                out=str(data["output"]) if data.get("output") else None,
                vocab=str(data.get("vocab", defaults.VOCAB)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"{where}: incomplete recipe ({e.__class__.__name__}: {e}); needs base and agents") from None
