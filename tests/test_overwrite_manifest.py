"""``--overwrite`` replaces only what RAM Desktop wrote (docs/contracts.md, "What a merge writes"): every
output folder lists its files with size and content hash (xxh3-128) in ``ram-manifest.json``; anything else in the folder
(a user's notes, a changed card, forged markers) makes it refused, named, untouched. Each case through a
fresh ``ram-merge`` process."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import xxhash

from .conftest import make_models, tree_snapshot
from .subproc import cli, refused


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    base, agents = make_models(tmp_path_factory.mktemp("manifest") / "in")
    return [str(base), *map(str, agents)]


def _merge(tmp_path: Path, inputs: list[str], out: Path, *extra: str):
    return cli(tmp_path, "merge", *inputs, "--out", str(out), *extra)


def test_the_manifest_lists_every_file_the_merge_wrote_with_size_and_content_hash(tmp_path, inputs):
    out = tmp_path / "out"
    done = _merge(tmp_path, inputs, out)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "ram-manifest.json").read_text())
    assert manifest["format"] == "ram-manifest/2"
    on_disk = sorted(p.name for p in out.iterdir() if p.name != "ram-manifest.json")
    assert sorted(manifest["files"]) == on_disk
    assert {"model.safetensors", "config.json", "README.md", "ram-recipe.yaml", "merge-report.json"} <= set(on_disk)
    for name, entry in manifest["files"].items():
        data = (out / name).read_bytes()
        assert entry == {"size": len(data), "xxh3_128": xxhash.xxh3_128(data).hexdigest()}, name


def test_overwrite_never_deletes_what_the_user_added_to_an_earlier_output(tmp_path, inputs):
    out = tmp_path / "merged"
    assert _merge(tmp_path, inputs, out).returncode == 0
    (out / "my-notes.md").write_text("what I learned\n")
    (out / "eval-results").mkdir()
    (out / "eval-results" / "scores.json").write_text('{"acc": 0.71}\n')
    before = tree_snapshot(out)
    line = refused(
        _merge(tmp_path, inputs, out, "--overwrite", "--method", "ram"),
        "my-notes.md",
        "eval-results/scores.json",
        "merged-2",
    )
    assert "RAM Desktop did not write" in line
    assert tree_snapshot(out) == before
    assert (out / "my-notes.md").read_text() == "what I learned\n"
    assert not (tmp_path / "merged-2").exists()


def _overwrite_refused_untouched(tmp_path: Path, inputs: list[str], out: Path, *named: str) -> None:
    """``--overwrite`` into ``out`` is refused naming ``named``, and nothing in ``out`` changes."""
    before = tree_snapshot(out)
    refused(_merge(tmp_path, inputs, out, "--overwrite"), *named)
    assert tree_snapshot(out) == before


def test_overwrite_refuses_an_output_whose_files_the_user_changed(tmp_path, inputs):
    out = tmp_path / "merged"
    assert _merge(tmp_path, inputs, out).returncode == 0
    card = out / "README.md"
    card.write_text(card.read_text() + "\nMy own findings.\n")
    _overwrite_refused_untouched(tmp_path, inputs, out, "README.md")


def test_overwrite_refuses_a_file_changed_in_place_with_its_size_kept(tmp_path, inputs):
    out = tmp_path / "merged"
    assert _merge(tmp_path, inputs, out).returncode == 0
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight: same size, other content
    weights.write_bytes(bytes(data))
    _overwrite_refused_untouched(tmp_path, inputs, out, "model.safetensors")


def test_an_earlier_versions_sha256_manifest_is_still_honoured(tmp_path, inputs):
    out = tmp_path / "merged"
    assert _merge(tmp_path, inputs, out).returncode == 0
    listed = json.loads((out / "ram-manifest.json").read_text())["files"]
    earlier = {
        name: {"size": entry["size"], "sha256": hashlib.sha256((out / name).read_bytes()).hexdigest()}
        for name, entry in listed.items()
    }
    (out / "ram-manifest.json").write_text(json.dumps({"format": "ram-manifest/1", "files": earlier}))
    card = out / "README.md"
    text = card.read_text()
    card.write_text(text.replace("a", "b", 1))  # same size, changed: the SHA-256 tells
    assert card.stat().st_size == len(text.encode())
    _overwrite_refused_untouched(tmp_path, inputs, out, "README.md")
    card.write_text(text)
    done = _merge(tmp_path, inputs, out, "--overwrite", "--method", "ram")
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "ram-manifest.json").read_text())["format"] == "ram-manifest/2"


def test_forged_or_empty_markers_never_make_a_folder_replaceable(tmp_path, inputs):
    folder = tmp_path / "holiday"
    folder.mkdir()
    (folder / "merge-report.json").write_text("")
    (folder / "ram-recipe.yaml").write_text("")
    (folder / "photos.txt").write_text("beach\n")
    before = tree_snapshot(folder)
    refused(_merge(tmp_path, inputs, folder, "--overwrite"), "photos.txt", "holiday-2")
    assert tree_snapshot(folder) == before
    # a forged manifest that does not match the files does not help either
    (folder / "ram-manifest.json").write_text(json.dumps({"format": "ram-manifest/1", "files": {}}))
    refused(_merge(tmp_path, inputs, folder, "--overwrite"), "photos.txt")
    assert (folder / "photos.txt").read_text() == "beach\n"


def test_an_unchanged_output_is_replaced_and_one_of_an_earlier_version_only_in_its_exact_layout(tmp_path, inputs):
    out = tmp_path / "out"
    assert _merge(tmp_path, inputs, out).returncode == 0
    first = (out / "model.safetensors").read_bytes()
    done = _merge(tmp_path, inputs, out, "--overwrite", "--method", "ram")
    assert done.returncode == 0, done.stderr
    assert (out / "model.safetensors").read_bytes() != first
    # an output written before manifests existed: replaced when it has exactly the earlier layout
    (out / "ram-manifest.json").unlink()
    done = _merge(tmp_path, inputs, out, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert (out / "model.safetensors").read_bytes() == first
    # ... and refused with anything else in it
    (out / "ram-manifest.json").unlink()
    (out / "notes.txt").write_text("mine\n")
    refused(_merge(tmp_path, inputs, out, "--overwrite"), "notes.txt")
    assert (out / "notes.txt").read_text() == "mine\n"


def test_compare_overwrite_never_deletes_what_the_user_put_in_a_variant_folder(tmp_path, inputs):
    out = tmp_path / "cmp"
    done = cli(tmp_path, "compare", *inputs, "--out", str(out), "--variant", "ram", "--variant", "ties")
    assert done.returncode == 0, done.stderr
    assert (out / "ram-manifest.json").is_file() and (out / "ram" / "ram-manifest.json").is_file()
    (out / "ram" / "notes.txt").write_text("this one looked best\n")
    before = tree_snapshot(out)
    refused(cli(tmp_path, "compare", *inputs, "--out", str(out), "--variant", "ram", "--overwrite"), "ram/notes.txt")
    assert tree_snapshot(out) == before
    (out / "ram" / "notes.txt").unlink()
    done = cli(tmp_path, "compare", *inputs, "--out", str(out), "--variant", "ram", "--overwrite")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("extra", ["empty-folder", "fifo", "symlink"])
def test_anything_that_is_not_a_listed_file_is_refused_never_opened(tmp_path, inputs, extra):
    out = tmp_path / "out"
    assert _merge(tmp_path, inputs, out).returncode == 0
    target = tmp_path / "precious.txt"
    target.write_text("elsewhere\n")
    if extra == "empty-folder":
        (out / "placeholder").mkdir()
    elif extra == "fifo":
        os.mkfifo(out / "placeholder")
    else:
        (out / "placeholder").symlink_to(target)
    refused(_merge(tmp_path, inputs, out, "--overwrite"), "placeholder")
    assert os.path.lexists(out / "placeholder") and target.read_text() == "elsewhere\n"
