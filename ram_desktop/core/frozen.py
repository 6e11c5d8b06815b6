"""Read-only values for a frozen spec: ``freeze`` turns mappings and lists, nested, into ``FrozenMap`` and
``FrozenList``; ``thaw`` turns them back into the plain dicts and lists the engine and YAML take.

Written here rather than using ``types.MappingProxyType``: a spec is pickled to search trials' workers and
deep-copied, and a mapping proxy can be neither. Both types compare equal to their plain counterparts
(``FrozenMap({"a": 1}) == {"a": 1}``, ``FrozenList([1]) == [1]``), so code reading a spec need not care."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class FrozenMap(Mapping[str, Any]):
    """An immutable mapping (no item assignment, no deletion); picklable and hashable when its values are."""

    __slots__ = ("_items",)
    _items: dict[str, Any]

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_items", dict(items or {}))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __repr__(self) -> str:
        return repr(self._items)

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return (FrozenMap, (self._items,))


class FrozenList(tuple):
    """An immutable list: a tuple that also equals a list with the same items (a gradient, a filter list)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return tuple.__eq__(self, tuple(other)) if isinstance(other, list) else tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return repr(list(self))


def freeze(value: Any) -> Any:
    """``value`` with every mapping a ``FrozenMap`` and every list or tuple a ``FrozenList``, nested."""
    if isinstance(value, Mapping):
        return FrozenMap({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return FrozenList(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """``value`` with every mapping a plain dict and every list or tuple a plain list, nested."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value
