"""The merge being drafted in the window, as a value (no Qt): what the method form shows (the method, its values
for every agent and each agent's own, ε as typed, the output settings, a file's layer map, the tokenizer), held in
the session model (``Session.draft``, topic ``Topic.DRAFT``). The form writes it on every edit and shows it when
another part of the window writes it (a recipe opened, a search's best trial used, the device remembered); what
runs — a merge, an analysis, a saved recipe, a comparison, a search — is made from the session alone:
``merge_spec(sources, draft)``. Per-agent values are kept by the Sources row's key, so they follow their agent
through reorder and rename; so does a layer map (``BoundSlices``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from ..core import METHODS, OUT_DTYPES, VOCAB_MODES, Agent, InputError, MergeSpec, defaults, thaw

BASE = "base"  # the layer map's key of model 0: whichever base the Sources show
Identities = Sequence[tuple[Any, str]]  # each agent's (row key, name), in order


class Sources(Protocol):
    """What a spec takes of the session's sources (``session.SourcesState``, not imported: the session imports
    this module): the base and the agents in order, and each agent's row key and name."""

    @property
    def chosen(self) -> tuple[str, tuple[Agent, ...]]: ...

    @property
    def identities(self) -> list[tuple[Any, str]]: ...


def _frozen(values: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class BoundSlices:
    """A layer map with each source's model as a row key (``BASE`` or an agent's key) and each slice's per-agent
    parameter values keyed by agent key, so neither depends on the agents' order or names."""

    slices: tuple[Mapping[str, Any], ...]
    stacking: bool
    method: str
    names: Mapping[Any, str]  # each agent's name as last seen (a removed agent is still named)

    @classmethod
    def bind(cls, slices: Sequence[Mapping[str, Any]], method: str, agents: Identities) -> BoundSlices:
        """``slices`` as a spec holds them (models by position, per-agent values by name) bound to ``agents``,
        the (key, name) of each agent in the spec's order."""
        keys = [BASE, *(key for key, _ in agents)]
        by_name = {name: key for key, name in agents}
        bound = []
        for s in slices:
            entry: dict[str, Any] = {
                "sources": [
                    {"model": keys[int(x["model"])], "layer_range": list(x["layer_range"])} for x in s["sources"]
                ]
            }
            if s.get("parameters") is not None:
                entry["parameters"] = _rekeyed(method, s["parameters"], by_name)
            bound.append(entry)
        return cls(tuple(bound), all(len(s["sources"]) == 1 for s in bound), method, _frozen(dict(agents)))

    def models(self) -> list[Any]:
        """The keys of the models the map reads, each once, in the order first read."""
        seen: list[Any] = []
        for s in self.slices:
            for x in s["sources"]:
                if x["model"] not in seen:
                    seen.append(x["model"])
        return seen

    def missing(self, agents: Identities) -> list[str]:
        """The names of the agents the map reads that are not among ``agents`` any more."""
        present = {key for key, _ in agents}
        return [self.names.get(key, "?") for key in self.models() if key != BASE and key not in present]

    def follow(self, agents: Identities) -> BoundSlices:
        """The map with the agents named as they are called now (renamed agents); itself when none was renamed."""
        names = {**self.names, **dict(agents)}
        return self if names == dict(self.names) else dataclasses.replace(self, names=_frozen(names))

    def left_out(self, agents: Identities) -> list[str]:
        """Names of the agents a merge's map does not read (every slice of a merge reads every model once)."""
        if self.stacking:
            return []
        read = set(self.models())
        return [name for key, name in agents if key not in read]

    def spec_slices(self, agents: Identities) -> list[dict[str, Any]]:
        """The map as a spec holds it for these agents: models by position, per-agent values by name. Call it
        only when ``missing(agents)`` is empty."""
        position = {BASE: 0, **{key: k + 1 for k, (key, _) in enumerate(agents)}}
        name_of = {key: name for key, name in agents}
        out = []
        for s in self.slices:
            entry: dict[str, Any] = {
                "sources": [
                    {"model": position[x["model"]], "layer_range": list(x["layer_range"])} for x in s["sources"]
                ]
            }
            if s.get("parameters") is not None:
                entry["parameters"] = _rekeyed(self.method, s["parameters"], name_of)
            out.append(entry)
        return out

    def set_in(self, name: str) -> int:
        """In how many slices the parameter ``name`` is set (replacing the form's value for their layers)."""
        return sum(1 for s in self.slices if name in (s.get("parameters") or {}))

    def problem(self, agents: Identities) -> str | None:
        """Why the map no longer fits ``agents`` (in the window's words), or None."""
        missing, left_out = self.missing(agents), self.left_out(agents)
        if missing:
            names = " and ".join(missing)
            return (
                f"The layer map reads {names}, no longer among the agents (removed in section 1): clear the "
                "layer map to merge whole models, or open the file again"
            )
        if left_out:
            names = " and ".join(left_out)
            return (
                f"The layer map merges the same models in every slice, without {names}: remove {names} in "
                "section 1, or clear the layer map to merge whole models"
            )
        return None


def _rekeyed(method: str, params: Mapping[str, Any], keys: Mapping[Any, Any]) -> dict[str, Any]:
    """``params`` with each per-agent mapping's keys translated through ``keys`` (names to row keys or back);
    entries of agents not in ``keys`` are dropped, other values kept as they are."""
    per_agent = {p.name for p in METHODS[method].params if p.per_agent} if method in METHODS else set()
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name in per_agent and isinstance(value, Mapping) and set(value) <= set(keys):
            out[name] = {keys[k]: v for k, v in value.items()}
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class Draft:
    """The merge the method form shows. ``params``: each parameter's value for every agent (a per-agent setting's
    default, given while none of its rows is filled); ``per_agent``: each per-agent parameter's filled rows, as
    value by agent row key; ``eps``, ``shard_size`` and ``output`` as typed; ``tokenizer``: the tokenizer block
    (None: the base's files) and a recipe's ``chat_template``; ``layer_map``: a file's slices, bound to the rows."""

    method: str = defaults.METHOD
    params: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    per_agent: Mapping[str, Mapping[Any, Any]] = field(default_factory=lambda: _frozen({}))
    eps: str = repr(defaults.EPS)
    device: str = "auto"
    out_dtype: str = next(iter(OUT_DTYPES))
    shard_size: str = defaults.SHARD_SIZE
    output: str = ""
    vocab: str = VOCAB_MODES[0]
    layer_map: BoundSlices | None = None
    tokenizer: Mapping[str, Any] | None = None
    chat_template: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _frozen(self.params))
        object.__setattr__(self, "per_agent", _frozen({k: _frozen(v) for k, v in self.per_agent.items()}))
        if self.tokenizer is not None:
            object.__setattr__(self, "tokenizer", _frozen(self.tokenizer))

    def edited(self, **changes: Any) -> Draft:
        """The draft with these fields changed."""
        return dataclasses.replace(self, **changes)

    def with_method(self, name: str, params: Mapping[str, Any], agents: Identities) -> Draft:
        """The draft with method ``name`` and these values set (None: left as they are), as the form takes them:
        the same method keeps the values not given, another starts from its defaults; a per-agent value is a list
        in agent order, comma-separated text, or (a setting) one value for every agent. Raises ``ValueError`` for
        an unknown method."""
        if name not in METHODS:
            raise ValueError(name)
        same = name == self.method
        shared = dict(self.params) if same else {}
        rows = {key: dict(v) for key, v in self.per_agent.items()} if same else {}
        schema = {p.name: p for p in METHODS[name].params}
        for key, value in params.items():
            param = schema.get(key)
            if param is None or value is None:
                continue
            if param.per_agent:
                if param.setting and not isinstance(value, list):
                    items = [value] * len(agents)
                else:
                    items = value.split(",") if isinstance(value, str) else list(value)
                rows[key] = {k: v for (k, _), v in zip(agents, items) if v is not None}
            else:
                shared[key] = value
        return dataclasses.replace(self, method=name, params=shared, per_agent=rows)


def draft_of_spec(spec: MergeSpec, agents: Identities, current: Draft) -> Draft:
    """A validated spec as the form shows it, its agents being ``agents`` (key, name) now: its method and values
    (``with_method``), each agent's own values on its row (an agent without one shows the value for every agent),
    its layer map bound to the rows, ε and the output settings."""
    shared = thaw(spec.params)
    draft = current.with_method(spec.method, shared, agents)
    rows = {key: dict(v) for key, v in draft.per_agent.items()}
    for param in METHODS[spec.method].params:
        if param.per_agent and any(param.name in a.params for a in spec.agents):
            given = {a.name: thaw(a.params.get(param.name, shared.get(param.name))) for a in spec.agents}
            rows[param.name] = {key: given[name] for key, name in agents if given.get(name) is not None}
    return draft.edited(
        per_agent=rows,
        eps=repr(float(spec.eps)),
        device=spec.device,
        out_dtype=spec.out_dtype,
        shard_size=str(spec.shard_size),
        output=spec.output or "",
        vocab=spec.vocab,
        layer_map=BoundSlices.bind(spec.slices, spec.method, agents) if spec.slices else None,
        tokenizer=thaw(spec.tokenizer) if spec.tokenizer else None,
        chat_template=spec.chat_template,
    )


def _values(draft: Draft, keys: Sequence[Any]) -> tuple[dict[str, Any], dict[Any, dict[str, Any]]]:
    """The values for every agent and each agent's own (by key) for the agents ``keys``: a per-agent parameter
    with a filled row among them gives its rows, else its value for every agent (if any)."""
    shared = dict(draft.params)
    own: dict[Any, dict[str, Any]] = {key: {} for key in keys}
    for name, rows in draft.per_agent.items():
        filled = {key: v for key, v in rows.items() if key in own}
        if filled:
            shared.pop(name, None)
        for key, value in filled.items():
            if value is not None:
                own[key][name] = value
    return thaw(shared), own


def _agents(sources: Sources, draft: Draft) -> tuple[Agent, ...]:
    keys = [key for key, _ in sources.identities]
    _, own = _values(draft, keys)
    return tuple(dataclasses.replace(a, params=own[key]) for key, a in zip(keys, sources.chosen[1]))


def bad_eps(draft: Draft) -> InputError:
    return InputError(f"threshold ε {draft.eps!r} is not a non-negative number; write it like 1e-5")


def merge_spec(sources: Sources, draft: Draft) -> MergeSpec:
    """The spec of the sources and the draft, its layer map included. Raises ``InputError`` when ε is not a
    number or the agents no longer fit the layer map."""
    try:
        eps = float(draft.eps.strip())
    except ValueError:
        raise bad_eps(draft) from None
    slices = None
    if draft.layer_map is not None:
        problem = draft.layer_map.problem(sources.identities)
        if problem is not None:
            raise InputError(problem)
        slices = tuple(draft.layer_map.spec_slices(sources.identities))
    shared, _ = _values(draft, [key for key, _ in sources.identities])
    return MergeSpec(
        base=sources.chosen[0],
        agents=_agents(sources, draft),
        method=draft.method,
        params=shared,
        eps=eps,
        device=draft.device,
        out_dtype=draft.out_dtype,
        shard_size=draft.shard_size.strip() or defaults.SHARD_SIZE,
        output=draft.output.strip() or None,
        vocab=draft.vocab,
        slices=slices,
        tokenizer=thaw(draft.tokenizer) if draft.tokenizer is not None else None,
        chat_template=draft.chat_template,
    )


def checked_merge_spec(sources: Sources, draft: Draft) -> MergeSpec:
    """The spec, validated as the engine will validate it (ε, parameters); raises ``InputError``."""
    spec = merge_spec(sources, draft)
    if not (spec.eps >= 0 and spec.eps != float("inf")):
        raise bad_eps(draft)
    spec.resolved_params()
    return spec


def engine_params(sources: Sources, draft: Draft) -> dict[str, Any]:
    """The draft's parameters as the engine takes them (per-agent values in agent order), for the estimates the
    Analysis view draws; {} while a per-agent value is missing for some agent (the estimate shows the defaults)."""
    try:
        shared, _ = _values(draft, [key for key, _ in sources.identities])
        return MergeSpec(agents=_agents(sources, draft), method=draft.method, params=shared).engine_params()
    except InputError:
        return {}


def form_params(draft: Draft, agents: Identities) -> dict[str, Any]:
    """Each parameter of the draft's method as the form reads it: a per-agent one by agent name (a setting's
    empty row: None), or its value for every agent while no row is filled."""
    out: dict[str, Any] = {}
    for param in METHODS[draft.method].params if draft.method in METHODS else ():
        rows = {key: v for key, v in draft.per_agent.get(param.name, {}).items() if key in dict(agents)}
        if not param.per_agent or not rows:
            out[param.name] = draft.params.get(param.name)
        elif param.setting:
            out[param.name] = {name: rows.get(key) for key, name in agents}
        else:
            out[param.name] = {name: rows[key] for key, name in agents if key in rows}
    return out
