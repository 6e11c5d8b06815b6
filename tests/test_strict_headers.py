"""Safetensors headers are checked as strictly as the safetensors library checks them (issue 22): every
hand-written file the library refuses is refused by ``read_header`` with a message naming the file (and
the tensor), and every file the library accepts is accepted. Through the CLI, corrupt headers that were
merged with exit 0 or crashed with a traceback are one ``error:`` line and exit 2."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from safetensors import safe_open

from ram_desktop.core.errors import InputError
from ram_desktop.core.storage.formats.safetensors_format import open_slices, read_header

from .conftest import tree_snapshot
from .subproc import cli, refused


def write(path: Path, header: dict | bytes, data: bytes) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def f32(begin: int, end: int, shape: list | None = None) -> dict:
    return {"dtype": "F32", "shape": [(end - begin) // 4] if shape is None else shape, "data_offsets": [begin, end]}


def library_refuses(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="pt") as f:
            list(f.keys())
    except Exception:  # noqa: BLE001 - the library raises its own SafetensorError, or a JSON error
        return True
    return False


ENTRY = b'{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
# case -> (header, data bytes, what the message says)
REFUSED = {
    "overlapping_byte_ranges": ({"a": f32(0, 8), "b": f32(4, 12)}, 12, "overlap"),
    "same_byte_range_twice": ({"a": f32(0, 8), "b": f32(0, 8)}, 8, "overlap"),
    "gap_between_tensors": ({"a": f32(0, 4), "b": f32(8, 12)}, 12, "belong to no tensor"),
    "gap_at_start": ({"a": f32(4, 8)}, 8, "belong to no tensor"),
    "trailing_bytes": ({"a": f32(0, 4)}, 8, "belong to no tensor"),
    "trailing_bytes_no_tensor": ({}, 4, "belong to no tensor"),
    "empty_tensor_past_the_end": ({"a": f32(0, 4), "z": f32(8, 8, [0])}, 4, "outside the file"),
    "offsets_reversed": ({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}}, 4, "data_offsets"),
    "repeated_tensor_name": (
        (
            b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
        ),
        8,
        "'a' appears twice",
    ),
    "data_offsets_as_strings": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}}, 4, "data_offsets"),
    "data_offsets_bools": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [False, 4]}}, 4, "data_offsets"),
    "data_offsets_floats": (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}}', 4, "data_offsets"),
    "data_offsets_three": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 4]}}, 4, "data_offsets"),
    "data_offsets_negative": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, 4, "data_offsets"),
    "data_offsets_not_a_list": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": 4}}, 4, "data_offsets"),
    "shape_negative": ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, 4, "shape"),
    "shape_bool": ({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, 4, "shape"),
    "shape_float": (b'{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', 4, "shape"),
    "shape_not_a_list": ({"a": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}}, 4, "shape"),
    "dtype_not_a_string": ({"a": {"dtype": 1, "shape": [1], "data_offsets": [0, 4]}}, 4, "dtype"),
    "dtype_unknown": ({"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 4]}}, 4, "dtype X9"),
    "entry_missing_shape": ({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, 4, "has no shape"),
    "entry_not_an_object": ({"a": 1}, 0, "not an object"),
    "size_does_not_match_shape": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4, "needs 8"),
    "shape_overflows": ({"a": {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 4]}}, 4, "needs"),
    "metadata_not_an_object": ({"__metadata__": [1], "a": f32(0, 4)}, 4, "__metadata__ is a list"),
    "metadata_a_string": ({"__metadata__": "pt", "a": f32(0, 4)}, 4, "__metadata__ is a string"),
    "metadata_value_not_a_string": ({"__metadata__": {"k": 1}, "a": f32(0, 4)}, 4, "__metadata__ 'k' is a number"),
    "metadata_value_an_object": ({"__metadata__": {"k": {"x": "y"}}, "a": f32(0, 4)}, 4, "'k' is an object"),
    "nested_128_levels": (
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":' + b"[" * 126 + b"]" * 126 + b"}}",
        4,
        "nested too deeply",
    ),
    "nested_100k_levels": (b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}", 0, "nested too deeply"),
    "header_not_starting_with_brace": (b'["a"]', 0, "does not start with '{'"),
    "header_with_byte_order_mark": (b"\xef\xbb\xbf{" + ENTRY[1:], 4, "does not start with '{'"),
    "header_not_utf8": (b'{"a\xff":' + ENTRY + b"}", 4, "not UTF-8"),
    "nan_in_header": (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":NaN}}', 4, "NaN"),
    "number_out_of_range": (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1e999}}', 4, "1e999"),
    "trailing_garbage_in_header": (b'{"a":' + ENTRY + b"}\x00", 4, "invalid JSON"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_like_the_library(tmp_path, case):
    header, size, fragment = REFUSED[case]
    path = write(tmp_path / "model.safetensors", header, b"\0" * size)
    assert library_refuses(path), f"{case}: the safetensors library accepts this file"
    with pytest.raises(InputError) as caught:
        read_header(path)
    message = str(caught.value)
    assert message.startswith(str(path)), message
    assert fragment in message, (fragment, message)
    with pytest.raises(InputError):  # the slice reader validates too: it never maps an unchecked header
        open_slices(path)


def test_messages_name_the_tensor(tmp_path):
    cases = {
        "a_bad": ({"a_bad": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}}, 4),
        "b_late": ({"a_first": f32(0, 4), "b_late": f32(8, 12)}, 12),
        "b_over": ({"a_first": f32(0, 8), "b_over": f32(4, 12)}, 12),
        "z_last": ({"a_first": f32(0, 4), "z_last": f32(4, 8)}, 12),
    }
    for name, (header, size) in cases.items():
        path = write(tmp_path / f"{name}.safetensors", header, b"\0" * size)
        with pytest.raises(InputError, match=repr(name)):
            read_header(path)


ACCEPTED = {
    "one_tensor": ({"a": f32(0, 4)}, 4),
    "stored_out_of_order": ({"b": f32(4, 8), "a": f32(0, 4)}, 8),
    "empty_tensors": ({"e": f32(0, 0, [0]), "a": f32(0, 4), "z": f32(4, 4, [3, 0])}, 4),
    "no_tensors": ({}, 0),
    "metadata_null": ({"__metadata__": None, "a": f32(0, 4)}, 4),
    "metadata_strings": ({"__metadata__": {"format": "pt", "x": ""}, "a": f32(0, 4)}, 4),
    "extra_key_in_entry": ({"a": dict(f32(0, 4), extra={"any": [1, 2]})}, 4),
    "nested_127_levels": (
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":' + b"[" * 125 + b"]" * 125 + b"}}",
        4,
    ),
    "whitespace_around_header": (b'  \n{"a":' + ENTRY + b"}    ", 4),
    "scalar_tensor": ({"s": {"dtype": "BF16", "shape": [], "data_offsets": [0, 2]}}, 2),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_accepted_like_the_library(tmp_path, case):
    header, size = ACCEPTED[case]
    path = write(tmp_path / "model.safetensors", header, bytes(range(size)))
    assert not library_refuses(path), f"{case}: the safetensors library refuses this file"
    tensors, _ = read_header(path)
    with safe_open(str(path), framework="pt") as theirs, open_slices(path) as mine:
        assert sorted(tensors) == sorted(theirs.keys()) == sorted(mine.keys())
        for name in tensors:
            expected = theirs.get_tensor(name)
            assert list(tensors[name].shape) == list(expected.shape)
            got = mine.get_tensor(name)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert (
                got.view(-1).view(dtype=__import__("torch").uint8).tolist()
                == expected.view(-1).view(dtype=__import__("torch").uint8).tolist()
            )


@pytest.mark.parametrize(
    "header",
    [
        b'{"a":' + ENTRY + b',"a":' + ENTRY + b"}",  # the same name twice with the same entry
        b'{"a":["F32",[1],[0,4]]}',  # an entry as a list (serde reads a struct from a sequence)
        b'{"__metadata__":{"k":"1","k":"2"},"a":' + ENTRY + b"}",  # a metadata key twice
    ],
    ids=["repeated_identical_name", "entry_as_list", "repeated_metadata_key"],
)
def test_ambiguous_headers_refused_although_the_library_reads_them(tmp_path, header):
    """Stricter than the library on purpose: which of two entries it keeps is an accident of its parser."""
    path = write(tmp_path / "model.safetensors", header, b"\0" * 4)
    with pytest.raises(InputError, match="model.safetensors"):
        read_header(path)


def test_slice_reader_revalidates_a_file_changed_after_its_header_was_read(tmp_path):
    path = write(tmp_path / "model.safetensors", {"a": f32(0, 4)}, b"\0" * 4)
    read_header(path)
    write(path, {"a": f32(0, 4), "b": f32(0, 4)}, b"\0" * 8)  # overlapping now, and a different size
    with pytest.raises(InputError, match="overlap"):
        open_slices(path)


def test_parse_json_finite_refuses_what_strict_parsers_refuse():
    from ram_desktop.core.storage.safe_read import parse_json

    assert parse_json('{"x": NaN}', "f")["x"] != 0  # Python's json reads NaN: kept for other files
    for text in ('{"x": NaN}', '{"x": -Infinity}', "[1e400]"):
        with pytest.raises(InputError, match="not a finite number"):
            parse_json(text, "f", finite=True)
    assert parse_json("[1.5, 2]", "f", finite=True) == [1.5, 2]


# ---- through the CLI, in a fresh process: exit 2, one line, nothing written, inputs untouched ----


def _rewrite_header(file: Path, edit) -> None:
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    text = edit(raw[8 : 8 + n].decode().rstrip())
    file.write_bytes(struct.pack("<Q", len(text.encode())) + text.encode() + raw[8 + n :])


def _same_shape_pair(file: Path) -> tuple[str, str, dict]:
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    entries = sorted(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"])
    for i, (first, e1) in enumerate(entries):
        for second, e2 in entries[i + 1 :]:
            if (e1["dtype"], e1["shape"]) == (e2["dtype"], e2["shape"]):
                return first, second, header
    raise AssertionError("no two tensors of the same shape")


def _merge_refused(tmp_path, models, bad_agent: Path, *fragments: str) -> str:
    base, agents = models
    before = tree_snapshot(base.parent)
    out = tmp_path / "out"
    done = cli(tmp_path, "merge", str(base), str(bad_agent), str(agents[1]), "--out", str(out))
    line = refused(done, *fragments)
    assert not out.exists() and not list(tmp_path.glob("out.partial-*"))
    assert tree_snapshot(base.parent) == before
    return line


def test_overlapping_tensors_cli(tmp_path, models):
    """ba1bdff merged this with exit 0 (the second tensor read the first one's bytes)."""
    file = models[1][0] / "model.safetensors"
    first, second, header = _same_shape_pair(file)
    header[second]["data_offsets"] = header[first]["data_offsets"]
    _rewrite_header(file, lambda _: json.dumps(header))
    _merge_refused(tmp_path, models, models[1][0], str(file), "overlap", second)


def test_repeated_tensor_name_cli(tmp_path, models):
    """ba1bdff merged this with exit 0 (Python's json kept the last entry)."""
    file = models[1][0] / "model.safetensors"
    first, second, header = _same_shape_pair(file)
    entry = json.dumps(header[second])
    _rewrite_header(file, lambda text: text[:-1] + f',"{first}":{entry}}}')
    assert library_refuses(file)
    _merge_refused(tmp_path, models, models[1][0], str(file), f"{first!r} appears twice")


def test_data_offsets_as_strings_cli(tmp_path, models):
    """ba1bdff: TypeError traceback."""
    file = models[1][0] / "model.safetensors"
    first, _, header = _same_shape_pair(file)
    header[first]["data_offsets"] = [str(o) for o in header[first]["data_offsets"]]
    _rewrite_header(file, lambda _: json.dumps(header))
    _merge_refused(tmp_path, models, models[1][0], str(file), "data_offsets", first)


def test_metadata_not_an_object_cli(tmp_path, models):
    """ba1bdff: AttributeError traceback."""
    file = models[1][0] / "model.safetensors"
    _, _, header = _same_shape_pair(file)
    header["__metadata__"] = ["format", "pt"]
    _rewrite_header(file, lambda _: json.dumps(header))
    _merge_refused(tmp_path, models, models[1][0], str(file), "__metadata__ is a list")


def test_header_nested_100k_deep_cli(tmp_path, models):
    """ba1bdff: RecursionError traceback."""
    file = models[1][0] / "model.safetensors"
    _rewrite_header(file, lambda text: text[:-1] + ',"x":' + "[" * 100_000 + "]" * 100_000 + "}")
    _merge_refused(tmp_path, models, models[1][0], str(file), "nested too deeply")


def test_probe_refuses_overlap_too_cli(tmp_path, models):
    base, agents = models
    file = agents[0] / "model.safetensors"
    first, second, header = _same_shape_pair(file)
    header[second]["data_offsets"] = header[first]["data_offsets"]
    _rewrite_header(file, lambda _: json.dumps(header))
    refused(cli(tmp_path, "probe", str(base), str(agents[0]), str(agents[1])), str(file), "overlap")
