"""File > Import / Export mergekit YAML and the Result step's Publish dialog, with real widgets."""

from __future__ import annotations

import threading
from pathlib import Path

import huggingface_hub as hf
import pytest
import torch
import yaml
from PySide6.QtCore import Qt

from ram_desktop.core import InputError
from ram_desktop.gui import ecosystem
from tests.gui.conftest import analyse, load_sources, merge
from tests.test_publish import FakeHfApi

SECRET = "hf_guiTypedSECRET345"


def _mergekit_yaml(path: Path, base: Path, agents: list[Path], **extra) -> Path:
    data = {
        "merge_method": "ties",
        "base_model": str(base),
        "models": [{"model": str(a), "parameters": {"weight": 1.0, "density": 0.3}} for a in agents],
        "parameters": {"lambda": 0.8},
        "dtype": "float32",
    }
    data.update(extra)
    path.write_text(yaml.safe_dump(data))
    return path


def test_import_mergekit_loads_like_a_recipe(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    assert window.menus.import_mergekit_action.text().startswith("&Import mergekit")
    assert ecosystem.import_mergekit(window, _mergekit_yaml(tmp_path / "mk.yaml", base, agents))
    qtbot.waitUntil(lambda: window.sources.all_ready(), timeout=10000)
    # a mergekit ties config with per-model weights imports as mergekit's own TIES (weighted-ties), with
    # mergekit's defaults for what the config leaves out (normalize on for ties)
    assert window.method.current.name == "weighted-ties", window.method.current.name
    params = window.method.params()
    names = window.sources.names
    assert params["weight"] == dict.fromkeys(names, 1.0) and params["density"] == dict.fromkeys(names, 0.3)
    assert params["lambda"] == 0.8
    assert params["normalize"] is True and params["dtype"] == "float32"
    assert window.sources.base.spec == str(base) and [r.spec for r in window.sources.agents] == list(map(str, agents))
    qtbot.waitUntil(lambda: window.report is not None and not window.busy(), timeout=30000)
    assert "int(k·n)" not in window.message.text.text()  # mergekit's TIES, computed as mergekit does: no caveat
    assert "(mergekit)" in window.windowTitle()
    assert window.menus.recipe_path is None  # Save recipe never overwrites the mergekit file


def test_import_refused_key_shows_the_error_and_changes_nothing(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    bad = _mergekit_yaml(tmp_path / "mk.yaml", base, agents, modules={"text_decoder": {"slices": []}})
    assert not ecosystem.import_mergekit(window, bad)
    assert "modules" in window.message.text.text()
    assert window.sources.base is None and window.method.current.name == "ram-plus"


def test_export_mergekit_writes_the_windows_recipe(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.method.set_method("task-arithmetic", {"scale": 0.4})
    window.method.set_out_dtype("float32")
    assert ecosystem.export_mergekit(window, tmp_path / "out.yaml")
    text = (tmp_path / "out.yaml").read_text()
    data = yaml.safe_load(text)
    assert data["merge_method"] == "task_arithmetic" and data["parameters"] == {"lambda": 0.4}
    assert data["base_model"] == str(base) and [m["model"] for m in data["models"]] == list(map(str, agents))
    assert text.startswith("# mergekit configuration exported by RAM Desktop")


def test_publish_button_uploads_the_result_and_keeps_no_token(
    qtbot, window, demo_models, tmp_path, settings, monkeypatch
):
    remote = tmp_path / "remote"
    remote.mkdir()
    existing: set[str] = set()
    monkeypatch.setattr(hf, "HfApi", lambda token=None, **kw: FakeHfApi(remote, existing, None, token=token))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hf.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(hf.constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    out = tmp_path / "merged"
    window.method.out_dir.setText(str(out))
    assert not window.publish_button.isEnabled()
    with qtbot.waitSignal(window.merge_finished, timeout=60000):
        qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    assert window.publish_button.isEnabled()

    dialogs: list[ecosystem.PublishDialog] = []
    monkeypatch.setattr(ecosystem.PublishDialog, "exec", lambda self: (dialogs.append(self), self.show())[0])
    qtbot.mouseClick(window.publish_button, Qt.LeftButton)
    dialog = dialogs[0]
    qtbot.addWidget(dialog)
    assert dialog.token_edit.echoMode() == dialog.token_edit.EchoMode.Password
    assert not dialog.publish_button.isEnabled()
    qtbot.keyClicks(dialog.repo, "me/demo-merge")
    dialog.private.setChecked(True)
    qtbot.keyClicks(dialog.token_edit, SECRET)
    dialog.grab().save(str(tmp_path / "publish.png"))
    qtbot.mouseClick(dialog.publish_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dialog.url is not None or "color" in dialog.status.text(), timeout=20000)
    assert dialog.url == "https://huggingface.co/me/demo-merge", dialog.status.text()
    assert dialog.url in dialog.status.text()
    api = FakeHfApi.instances[-1]
    assert api.token == SECRET and api.calls[0][3] is True
    assert (remote / "me/demo-merge" / "README.md").read_bytes() == (out / "README.md").read_bytes()
    dialog.wait()
    dialog.reject()
    assert dialog.token_edit.text() == ""
    settings.sync()
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert SECRET.encode() not in stored  # not in QSettings (settings.ini), outputs, recipes or the upload
    assert all(SECRET not in str(settings.value(k)) for k in settings.allKeys())
    assert SECRET not in window.log_view.toPlainText()


def test_a_lora_adapter_is_an_agent_in_the_window(qtbot, window, demo_models, tmp_path):
    """Dropping a PEFT adapter folder next to full agents: it opens, analyses and merges."""
    import json

    from safetensors.torch import save_file

    from ram_desktop.core.storage.formats.safetensors_format import read_header
    from tests.gui.conftest import drop_paths

    base, agents = demo_models
    tensors, _ = read_header(base / "model.safetensors")
    targets = [n for n in tensors if n.endswith("self_attn.q_proj.weight")]
    assert targets
    g = torch.Generator().manual_seed(11)
    factors = {}
    for name in targets:
        out, inp = tensors[name].shape
        module = "base_model.model." + name[: -len(".weight")]
        factors[f"{module}.lora_A.weight"] = torch.randn((2, inp), generator=g)
        factors[f"{module}.lora_B.weight"] = torch.randn((out, 2), generator=g) * 0.01
    adapter = tmp_path / "q-lora"
    adapter.mkdir()
    save_file(factors, str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 2,
                "lora_alpha": 4,
                "base_model_name_or_path": str(base),
                "target_modules": ["q_proj"],
            }
        )
    )
    drop_paths(window.sources, [base, agents[0], adapter])
    qtbot.waitUntil(lambda: window.sources.all_ready() and window.analyse_button.isEnabled(), timeout=10000)
    analyse(qtbot, window)
    assert window.report is not None and window.report.names[-1] == "q-lora"
    assert window.report.agents[-1].density > 0
    window.method.out_dir.setText(str(tmp_path / "merged"))
    merge(qtbot, window)
    assert (tmp_path / "merged" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "error, message",
    [(RuntimeError("boom"), "RuntimeError: boom"), (InputError("me/demo: refused"), "me/demo: refused")],
)
def test_a_publish_that_fails_or_crashes_is_reported_in_the_gui_thread(qtbot, tmp_path, monkeypatch, error, message):
    """The dialog hears the upload's end from the job (re-emitted in the GUI thread), never from the worker's own
    signals: a plain function connected there runs in the worker thread and touches widgets from it."""

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(ecosystem, "publish", broken)
    folder = tmp_path / "merged"
    folder.mkdir()
    dialog = ecosystem.PublishDialog(None, folder, repo_id="me/demo")
    qtbot.addWidget(dialog)
    heard: list[tuple[str, bool]] = []
    shown = dialog._failed

    def failed(text: str) -> None:
        heard.append((text, threading.current_thread() is threading.main_thread()))
        shown(text)

    dialog._failed = failed
    dialog.start()
    qtbot.waitUntil(lambda: dialog._job is None, timeout=20000)
    assert heard == [(message, True)]
    assert message in dialog.status.text() and not dialog.bar.isVisible()
