"""Reading the files users hand us, calmly: regular files only (a FIFO or a device never blocks a
read), UTF-8 text, JSON with bounded nesting and no repeated keys, YAML without aliases.

Every reader raises ``InputError`` naming the file and the problem; nothing here raises an ``OSError``,
``RecursionError`` or ``UnicodeDecodeError`` to its caller. One place does this so that every file
format (weights headers, indexes, configs, recipes, suites, caches) gets the same promise.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import InputError

if TYPE_CHECKING:
    import yaml

MAX_JSON_DEPTH = 64  # far beyond any config, index, header or suite row; serde_json (safetensors) stops at 128

_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def os_reason(error: OSError) -> str:
    """The plain cause of an OS error: 'No space left on device', 'Read-only file system' ..."""
    return error.strerror or error.__class__.__name__


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path | str) -> BinaryIO:
    """Open ``path`` for binary reading, refusing anything but a regular file (after following links).

    The file is opened non-blocking and checked on the open descriptor, so a FIFO swapped in after a
    check can still never block the caller."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise InputError(f"{path}: cannot read ({os_reason(e)})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"{path}: is {_kind(mode)}, not a file; point at a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: Path | str) -> None:
    """Refuse ``path`` unless it is a regular file, without opening it (``stat`` follows links)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise InputError(f"{path}: cannot read ({os_reason(e)})") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: is {_kind(mode)}, not a file; point at a regular file")


def read_bytes(path: Path | str, max_bytes: int | None = None) -> bytes:
    """The whole content of a regular file; ``max_bytes``: refused when it holds more than that."""
    with open_regular(path) as f:
        try:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        except OSError as e:
            raise InputError(f"{path}: cannot read ({os_reason(e)})") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise InputError(f"{path}: holds more than {max_bytes:,} bytes, far more than such a file does")
    return data


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped), or an ``InputError`` naming the offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{where}: not UTF-8 text (byte {e.start} is {data[e.start : e.start + 1]!r}); save it as UTF-8"
        ) from None


def read_text(path: Path | str) -> str:
    """A regular file's content as UTF-8 text."""
    return decode_utf8(read_bytes(path), str(path))


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def json_depth(value: Any) -> int:
    """How deeply lists and objects nest in a parsed JSON value (a scalar is 0), without recursion: one
    level at a time, so a wide value (a 300-tensor header) costs one list per level, not one tuple per item."""
    depth, level = 0, [value]
    while True:
        containers = [item for item in level if isinstance(item, (dict, list))]
        if not containers:
            return depth
        depth += 1
        level = [child for item in containers for child in (item.values() if isinstance(item, dict) else item)]


class _NotANumber(ValueError):
    def __init__(self, token: str) -> None:
        super().__init__(token)
        self.token = token


def _refuse_constant(token: str) -> Any:
    raise _NotANumber(token)


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _NotANumber(token)
    return value


def parse_json(text: str | bytes, where: str, max_depth: int | None = MAX_JSON_DEPTH, finite: bool = False) -> Any:
    """Parse JSON ``text``; refuse invalid JSON, repeated keys in one object and nesting deeper than
    ``max_depth``, each with an ``InputError`` that starts with ``where``.

    ``max_depth=None``: the caller checks the nesting of the value itself (where its shape bounds most of
    it: a safetensors header); nesting too deep for Python's parser is still refused here.

    ``finite``: also refuse what strict JSON parsers refuse and Python's ``json`` accepts: ``NaN``,
    ``Infinity`` and numbers too large for a double (``1e999``)."""
    hooks: dict[str, Any] = {"parse_constant": _refuse_constant, "parse_float": _finite_float} if finite else {}
    try:
        value = json.loads(text, object_pairs_hook=_unique_object, **hooks)
    except _DuplicateKey as e:
        raise InputError(f"{where}: the key {e.key!r} appears twice in one object; remove one") from None
    except _NotANumber as e:
        raise InputError(f"{where}: not valid JSON ({e.token} is not a finite number)") from None
    except RecursionError:
        limit = f" (more than {max_depth} levels)" if max_depth is not None else ""
        raise InputError(f"{where}: JSON nested too deeply{limit}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{where}: not valid JSON ({e})") from None
    if max_depth is not None and json_depth(value) > max_depth:
        raise InputError(f"{where}: JSON nested too deeply (more than {max_depth} levels)")
    return value


def read_json(path: Path | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A regular UTF-8 file's JSON content (see ``parse_json``)."""
    return parse_json(read_text(path), str(path), max_depth)


MAX_YAML_NODES = 100_000  # values after aliases are expanded: far beyond any recipe, suite or mergekit file


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` becomes once its aliases are expanded, counted on the composed graph (where an
    alias is a shared node), so a "billion laughs" is measured in microseconds, never built."""
    import yaml

    stack = [(node, False)]
    open_nodes: set[int] = set()
    while stack:
        current, children_done = stack.pop()
        if id(current) in sizes:
            continue
        if not children_done:
            if id(current) in open_nodes:
                return 1 << 62  # an alias inside its own anchor: endless
            open_nodes.add(id(current))
        children: list[yaml.Node] = []
        if isinstance(current, yaml.SequenceNode):
            children = list(current.value)
        elif isinstance(current, yaml.MappingNode):
            children = [n for pair in current.value for n in pair]
        if children_done:
            sizes[id(current)] = min(1 + sum(sizes[id(c)] for c in children), 1 << 62)
            open_nodes.discard(id(current))
        else:
            stack.append((current, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(node)]


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML ``text`` safely: plain data only (PyYAML's safe loader), and anchors and aliases only while
    the expanded document stays under ``MAX_YAML_NODES`` values. (PyYAML is imported here: the start-up
    reads its runtime marker through this module, and no YAML.)"""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_YAML_NODES:
            raise InputError(
                f"{where}: its aliases expand to more than {MAX_YAML_NODES:,} values; write the "
                "values out instead of repeating anchors"
            )
        return loader.construct_document(node)
    except RecursionError:
        raise InputError(f"{where}: YAML nested too deeply") from None
    except yaml.YAMLError as e:
        raise InputError(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None
    finally:
        loader.dispose()


def read_yaml(path: Path | str) -> Any:
    """A regular UTF-8 file's YAML content (see ``parse_yaml``)."""
    return parse_yaml(read_text(path), str(path))
