"""The method form for mergekit's methods: true/false as check boxes, per-agent values in one row per agent,
gradients typed as a list with a small plot over the layers, filters typed as YAML; what the form holds is what
the recipe gets, and a recipe's values come back into the form (offscreen Qt, real widgets)."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt

from ram_desktop.core.methods import get_method


def test_gradient_typed_shows_its_plot_and_reaches_the_params(qtbot, window):
    window.method.set_method("slerp")
    field = window.method.fields["t"].widget
    qtbot.waitUntil(field.edit.isVisible)  # the rebuilt form is laid out
    assert not field.plot.isVisible()
    field.edit.clear()
    qtbot.keyClicks(field.edit, "[0, 0.5, 1]")
    assert field.plot.isVisible()
    xs, ys = field.curve.getData()
    assert list(xs) == [0.0, 0.5, 1.0] and list(ys) == [0.0, 0.5, 1.0]
    assert window.method.params()["t"] == [0, 0.5, 1]
    field.edit.clear()
    qtbot.keyClicks(field.edit, "[{filter: self_attn, value: 0.3}, {value: 0.7}]")
    assert not field.plot.isVisible()
    params = window.method.params()
    assert params["t"] == [{"filter": "self_attn", "value": 0.3}, {"value": 0.7}]
    assert get_method("slerp").resolve(params)["t"] == params["t"]


def test_per_agent_values_and_check_boxes(qtbot, window):
    window.method.set_agent_names(["coder", "tool"])
    window.method.set_method("weighted-ties")
    weight = window.method.fields["weight"].widget
    normalize = window.method.fields["normalize"].widget
    qtbot.waitUntil(normalize.isVisible)  # the rebuilt form is laid out
    assert len(weight.edits) == 2
    qtbot.keyClicks(weight.edits[0], "0.3")
    qtbot.keyClicks(weight.edits[1], "[0.2, 0.9]")
    assert normalize.isChecked()  # mergekit's default for ties
    qtbot.mouseClick(normalize, Qt.LeftButton, pos=QPoint(8, normalize.height() // 2))  # on the box itself
    params = window.method.params()
    assert params["weight"] == {"coder": 0.3, "tool": [0.2, 0.9]} and params["normalize"] is False
    resolved = get_method("weighted-ties").resolve(
        dict(params, weight=[params["weight"][n] for n in ("coder", "tool")])
    )
    assert resolved["weight"] == [0.3, [0.2, 0.9]] and resolved["normalize"] is False


def test_a_recipes_values_come_back_into_the_form(window):
    window.method.set_agent_names(["a", "b"])
    given = {"weight": [[0.1, 0.6], {"filter": "mlp", "value": 2.0}], "normalize": False, "dtype": "inputs"}
    window.method.set_method("linear", given)
    assert window.method.params() == dict(given, weight={"a": [0.1, 0.6], "b": {"filter": "mlp", "value": 2.0}})
    window.method.fields["weight"].set_by_agent({"b": 0.25, "a": 0.75})  # an agent's own values, by name
    assert window.method.params()["weight"] == {"a": 0.75, "b": 0.25}
    window.method.set_method("linear", {"weight": {"filter": "mlp", "value": 2.0}})  # one filter for every agent
    assert window.method.params()["weight"] == {
        "a": {"filter": "mlp", "value": 2.0},
        "b": {"filter": "mlp", "value": 2.0},
    }
    window.method.set_method("linear", {"weight": 0.5})  # one value for every agent
    assert window.method.params()["weight"] == {"a": 0.5, "b": 0.5}
