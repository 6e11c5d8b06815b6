"""``MergeSpec``: the one description of a merge, shared by the command line, the window, comparisons,
mergekit import and export, and the recipe file ``ram-recipe.yaml`` (its YAML, docs/contracts.md).

A spec is frozen, its mappings and lists too (``core.frozen``). Each agent carries its name, its source and its
own values of per-agent parameters (``Agent.params``: ``{weight: 0.1}``); ``MergeSpec.params`` holds the values
that hold for every agent (scalars, a setting given once). So adding, removing, reordering or renaming agents
keeps each agent's values with it. The engine works on lists in agent order; ``engine_params`` is the one place
that makes them. The recipe file keys per-agent values by agent name (``weight: {coder: 0.1, tool: 0.2}``). What only affects how a merge runs, not what it
makes (overwrite, chunk size, the probe cache, the Hub token, the fused kernels), is ``RunOptions``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import defaults
from .engine.chunks import DEFAULT_CHUNK_ELEMENTS
from .engine.plan import Layout, check_agent_count
from .errors import InputError, NoAgents, NoBase, NoOutput
from .frozen import FrozenMap, freeze, thaw
from .recipe import (
    AGENT_KEYS,
    RECIPE_KEYS,
    check_parameters,
    known_keys,
    layout_of,
    read_slices,
    text_value,
    type_name,
)
from .storage.safe_read import read_yaml
from .tokenizer import read_chat_template, read_tokenizer

FORMAT = "ram-recipe/2"
FORMAT_V1 = "ram-recipe/1"  # per-agent values as lists in agent order; read and upgraded, never written
HEADER = "# RAM Desktop merge recipe. Reproduce with: ram-merge run ram-recipe.yaml [--out DIR]\n"


@dataclass(frozen=True)
class Agent:
    """One fine-tuned model: its name (unique in a spec), its source, and its own values of per-agent
    parameters by parameter name (a setting's entry for this agent too), read-only."""

    name: str
    source: str
    params: Mapping[str, Any] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", freeze(self.params))


@dataclass(frozen=True)
class RunOptions:
    """How a merge runs, not what it makes: never written to a recipe. ``token`` is for Hub sources only (None:
    HF_TOKEN or the stored login) and never leaves this object (not in repr). ``kernel_min_elements``: passes
    over fewer elements use the torch path instead of the fused CPU kernels (the window sets it so that loading
    them never freezes its event loop on a small model)."""

    overwrite: bool = False
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
    use_cache: bool = True
    token: str | None = field(default=None, repr=False, compare=False)
    kernel_min_elements: float = 0


def derive_name(source: str) -> str:
    """An agent's default name from its source: a Hub repository's name, a folder's name or a file's stem
    (the engine's ``plan.default_names`` reads the same off an opened checkpoint)."""
    from .sources import HUB_ID, split_applied

    text = str(source).strip()
    try:
        applied = split_applied(text)
    except InputError:
        applied = None  # refused when the source is opened
    if applied is not None:  # MODEL+ADAPTER: named after the adapter, as the opened checkpoint is
        text = applied[1]
    local = Path(text).expanduser()
    if HUB_ID.match(text) and not local.exists():
        return text.split("@", 1)[0].rstrip("/").split("/")[-1]
    return local.name if local.is_dir() or not local.suffix else local.stem


def derive_names(sources: Sequence[str]) -> list[str]:
    """Default names for ``sources``, made unique as ``plan.default_names`` does (``name``, ``name-2``, ...)."""
    names: list[str] = []
    taken: set[str] = set()
    next_suffix: dict[str, int] = {}  # per stem, the suffix to try next: linear in the number of sources
    for source in sources:
        stem = derive_name(source)
        name, k = stem, next_suffix.get(stem, 2)
        while name in taken:
            name, k = f"{stem}-{k}", k + 1
        next_suffix[stem] = k
        names.append(name)
        taken.add(name)
    return names


def make_agents(sources: Sequence[str], names: Sequence[str] | None = None) -> tuple[Agent, ...]:
    """Agents from sources and optional names (None: derived from the sources); names must be unique."""
    sources = [str(s) for s in sources]
    check_agent_count(len(sources))  # first: a list of thousands is refused before anything else is done
    if names is None:
        names = derive_names(sources)
    names = [str(n).strip() for n in names]
    if len(names) != len(sources):
        raise InputError(f"{len(names)} names for {len(sources)} agents; give one name per agent")
    if any(not n for n in names):
        raise InputError("an agent name is empty; give every agent a name")
    dupes = sorted(n for n, count in Counter(names).items() if count > 1)
    if dupes:
        raise InputError(f"two agents are named {dupes[0]!r}; agent names must differ")
    return tuple(Agent(n, s) for n, s in zip(names, sources))


def _per_agent_params(method: str) -> dict[str, Any]:
    """``method``'s per-agent parameters by name (none for an unknown method: the engine names it)."""
    from .methods import METHODS

    m = METHODS.get(method)
    return {p.name: p for p in m.params if p.per_agent} if m is not None else {}


def _param_order(method: str, keys: Sequence[str]) -> list[str]:
    """``keys`` without repeats in the order the method declares its parameters (others last, as given): the
    order a recipe writes them in."""
    from .methods import METHODS

    m = METHODS.get(method)
    declared = {p.name: i for i, p in enumerate(m.params)} if m is not None else {}
    unique = list(dict.fromkeys(keys))
    return sorted(unique, key=lambda k: (declared.get(k, len(declared)), unique.index(k)))


def split_params(
    method: str, params: Mapping[str, Any], names: Sequence[str], where: str = ""
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``params`` as a command line, a mergekit file or the engine give them, split into the values for every
    agent and each agent's own (in the order of ``names``). A per-agent value is a list in agent order,
    comma-separated text, or ``NAME=VALUE,...`` text; a setting's one value (a number, text without a comma,
    a ``{filter:, value:}`` mapping) holds for every agent. A list of the wrong length is refused."""
    per_agent = _per_agent_params(method)
    shared: dict[str, Any] = {}
    own: list[dict[str, Any]] = [{} for _ in names]
    for key, value in params.items():
        p = per_agent.get(key)
        if p is None or value is None or isinstance(value, Mapping):
            shared[key] = value
            continue
        if isinstance(value, str):
            pairs = [item.partition("=") for item in value.split(",")]
            if all(eq and k.strip() in names for k, eq, _ in pairs):  # NAME=VALUE,... keyed on the command line
                for k, _, v in pairs:
                    own[list(names).index(k.strip())][key] = v.strip()
                continue
            if p.setting and "," not in value:
                shared[key] = value  # one value for every agent
                continue
            items: list[Any] = [v.strip() for v in value.split(",")]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            if p.setting:
                shared[key] = value
                continue
            items = [value]
        if len(items) != len(names):
            raise InputError(
                f"{where}{p.flag if not where else 'parameters.' + key}: {len(items)} values for {len(names)} agents "
                f"({', '.join(names)}); give one per agent, in agent order"
            )
        for values, item in zip(own, items):
            values[key] = item
    return shared, own


def _by_agent_name(setting: bool, value: Any, names: Sequence[str]) -> bool:
    """In a recipe's form (its ``parameters:``, a layer map's), whether a per-agent parameter's ``value`` is keyed
    by agent name: a mapping, unless it is a setting's one ``{filter:, value:}`` for every agent (the file's rule;
    in a spec, where a value sits says what it is)."""
    if not isinstance(value, Mapping):
        return False
    keys = {str(k) for k in value}
    return not (setting and keys <= {"filter", "value"} and not keys <= set(names))


def _check_keyed(where: str, key: str, setting: bool, value: Mapping[str, Any], names: Sequence[str]) -> None:
    """A value keyed by agent name names only agents, and every agent unless the parameter is a setting."""
    unknown = [str(k) for k in value if str(k) not in names]
    if unknown:
        raise InputError(
            f"{where}parameters.{key}.{unknown[0]}: no agent of that name; the agents are {', '.join(names)}"
        )
    missing = [n for n in names if value.get(n) is None]
    if missing and not setting:
        raise InputError(f"{where}parameters.{key}: no value for agent {missing[0]}; give one for every agent")


def _slice_engine_params(method: str, params: Mapping[str, Any], names: Sequence[str], where: str) -> dict[str, Any]:
    """A layer map's parameters (keyed by agent name, as its recipe gives them) as the engine takes them."""
    per_agent = _per_agent_params(method)
    out: dict[str, Any] = {}
    for key, value in params.items():
        p = per_agent.get(key)
        if p is None or value is None:
            out[key] = value
        elif _by_agent_name(p.setting, value, names):
            _check_keyed(where, key, p.setting, value, names)
            out[key] = [value.get(n) for n in names]
        else:  # one value for every agent: a setting (a gradient list is repeated, a list being per agent there)
            out[key] = [value] * len(names) if isinstance(value, (list, tuple)) and p.setting else value
    return thaw(out)


@dataclass(frozen=True)
class MergeSpec:
    """A merge (see the module docstring). ``params``: the method's parameters that hold for every agent (each
    agent's own are on its ``Agent``); ``slices``: a layer map (docs/contracts.md, "slices"; model 0 is the
    base, i the i-th agent; per-agent values keyed by agent name), None for whole models; ``output``: the
    folder written (None: not chosen yet). Every mapping and list in it is read-only (``core.frozen``)."""

    base: str = ""
    agents: tuple[Agent, ...] = ()
    method: str = defaults.METHOD
    params: Mapping[str, Any] = field(default_factory=FrozenMap)
    eps: float = defaults.EPS
    out_dtype: str = defaults.OUT_DTYPE
    vocab: str = defaults.VOCAB
    # the output's tokenizer (``core.tokenizer``): None copies the base's files unchanged
    tokenizer: Mapping[str, Any] | None = None
    chat_template: str | None = None
    slices: tuple[Mapping[str, Any], ...] | None = None
    device: str = defaults.DEVICE
    shard_size: str = defaults.SHARD_SIZE
    output: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "agents", tuple(self.agents))
        object.__setattr__(self, "params", freeze(self.params))
        if self.tokenizer is not None:
            object.__setattr__(self, "tokenizer", freeze(self.tokenizer))
        if self.slices is not None:
            object.__setattr__(self, "slices", tuple(freeze(s) for s in self.slices))

    # --- building ------------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        base: str | Path,
        agents: Sequence[str | Path],
        output: str | Path | None = None,
        method: str = defaults.METHOD,
        params: Mapping[str, Any] | None = None,
        names: Sequence[str] | None = None,
        eps: float = defaults.EPS,
        device: str = defaults.DEVICE,
        out_dtype: str = defaults.OUT_DTYPE,
        shard_size: str = defaults.SHARD_SIZE,
        vocab: str = defaults.VOCAB,
        slices: Sequence[Mapping[str, Any]] | None = None,
        tokenizer: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> MergeSpec:
        """A spec from sources in agent order (``names`` None: derived from them) and parameters whose per-agent
        values are lists or comma-separated text in that order (a command line's, a mergekit file's)."""
        made = make_agents([str(a) for a in agents], names)
        keyed_names = [a.name for a in made]
        shared, own = split_params(method, dict(params or {}), keyed_names)
        return cls(
            base=str(base),
            agents=tuple(dataclasses.replace(a, params=o) for a, o in zip(made, own)),
            method=method,
            params=shared,
            eps=eps,
            out_dtype=out_dtype,
            vocab=vocab,
            tokenizer=tokenizer,
            chat_template=chat_template,
            slices=_keyed_slices(method, slices, keyed_names),
            device=device,
            shard_size=str(shard_size),
            output=str(output) if output is not None else None,
        )

    def replace(self, **changes: Any) -> MergeSpec:
        return dataclasses.replace(self, **changes)

    def with_agents(self, agents: Sequence[Agent]) -> MergeSpec:
        """The spec with these agents (added, removed, reordered, renamed): each brings its own values."""
        make_agents([a.source for a in agents], [a.name for a in agents])  # unique, non-empty names
        return dataclasses.replace(self, agents=tuple(agents))

    def with_method(self, method: str, params: Mapping[str, Any]) -> MergeSpec:
        """Another method with these parameters (``split_params``' forms) on the same agents, whose own values
        are replaced by those in ``params`` (a comparison's variant, the resolved parameters)."""
        shared, own = split_params(method, params, self.names)
        agents = tuple(dataclasses.replace(a, params=o) for a, o in zip(self.agents, own))
        return dataclasses.replace(self, method=method, params=shared, agents=agents)

    # --- reading ---------------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [a.name for a in self.agents]

    @property
    def sources(self) -> list[str]:
        return [a.source for a in self.agents]

    def layout(self) -> Layout | None:
        return layout_of(self.engine_slices())

    def check_base(self) -> None:
        """Raises ``NoBase`` when no base model is chosen (every step that merges needs one)."""
        if not self.base:
            raise NoBase()

    def check_agents(self) -> None:
        """Raises ``NoAgents`` when no agent is chosen (every step that merges needs one)."""
        if not self.agents:
            raise NoAgents()

    def check_output(self) -> None:
        """Raises ``NoOutput`` when no output folder is chosen (a merge writes one)."""
        if not self.output:
            raise NoOutput()

    def engine_params(self) -> dict[str, Any]:
        """The parameters as the engine takes them (plain values): each per-agent value as a list in agent order
        (an agent without its own value gets the spec's, else None, a setting's default; a parameter that every
        agent needs refuses a missing one)."""
        per_agent = _per_agent_params(self.method)
        keys = _param_order(self.method, [*self.params, *(k for a in self.agents for k in a.params)])
        out: dict[str, Any] = {}
        for key in keys:
            p = per_agent.get(key)
            shared = self.params.get(key)
            if not any(key in a.params for a in self.agents):
                repeat = p is not None and p.setting and isinstance(shared, (list, tuple))
                out[key] = [shared] * len(self.agents) if repeat else shared  # a gradient for every agent
                continue
            values = [a.params.get(key, shared) for a in self.agents]
            missing = [a.name for a, v in zip(self.agents, values) if v is None]
            if missing and not (p is not None and p.setting):
                raise InputError(f"parameters.{key}: no value for agent {missing[0]}; give one for every agent")
            out[key] = values
        return thaw(out)

    def keyed_params(self) -> dict[str, Any]:
        """The parameters as a recipe writes them (plain values): each per-agent value keyed by agent name."""
        keys = _param_order(self.method, [*self.params, *(k for a in self.agents for k in a.params)])
        out: dict[str, Any] = {}
        for key in keys:
            shared = self.params.get(key)
            if any(key in a.params for a in self.agents):
                out[key] = {
                    a.name: a.params.get(key, shared) for a in self.agents if key in a.params or shared is not None
                }
            else:
                out[key] = shared
        return thaw(out)

    def engine_slices(self) -> list[dict[str, Any]] | None:
        """The layer map with each slice's per-agent parameters as lists in agent order."""
        if self.slices is None:
            return None
        out = []
        for i, s in enumerate(self.slices):
            entry: dict[str, Any] = {"sources": thaw(s["sources"])}
            if s.get("parameters") is not None:
                entry["parameters"] = _slice_engine_params(self.method, s["parameters"], self.names, f"slices[{i}].")
            out.append(entry)
        return out

    def resolved_params(self) -> dict[str, Any]:
        """The method's parameters in the engine's form with its defaults filled in, validated (``InputError``)."""
        from .methods import get_method

        return get_method(self.method).resolve(self.engine_params())

    def resolved(self) -> MergeSpec:
        """This spec with every parameter stated (defaults filled in, values validated), each agent's on it."""
        return self.with_method(self.method, self.resolved_params())

    # --- the recipe file -----------------------------------------------------------------------------
    def to_yaml(self) -> str:
        data: dict[str, Any] = {
            "format": FORMAT,
            "method": self.method,
            "parameters": self.keyed_params(),
            "eps": self.eps,
            "base": self.base,
            "agents": [{"name": a.name, "source": a.source} for a in self.agents],
            "out_dtype": self.out_dtype,
            "shard_size": self.shard_size,
            "device": self.device,
        }
        if self.vocab != defaults.VOCAB:
            data["vocab"] = self.vocab
        if self.tokenizer is not None:
            data["tokenizer"] = thaw(self.tokenizer)
        if self.chat_template is not None:
            data["chat_template"] = self.chat_template
        if self.slices is not None:
            data["slices"] = thaw(self.slices)
        if self.output:
            data["output"] = self.output
        return HEADER + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> MergeSpec:
        return cls.from_dict(read_yaml(Path(path)), str(path))

    @classmethod
    def from_yaml(cls, text: str, where: str = "recipe") -> MergeSpec:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InputError(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None
        return cls.from_dict(data, where)

    @classmethod
    def from_dict(cls, data: Any, where: str = "recipe") -> MergeSpec:
        """A spec from a recipe's parsed YAML (``ram-recipe/2``, or ``ram-recipe/1`` upgraded: its per-agent
        lists mapped by position to the agents' names, recorded or derived). Every key is checked: an unknown
        or misplaced key, or a value of the wrong type, is refused naming it."""
        version = data.get("format") if isinstance(data, dict) else None
        if version not in (FORMAT, FORMAT_V1):
            raise InputError(f"{where}: not a RAM Desktop recipe (needs 'format: {FORMAT}')")
        known_keys(where, "", data, RECIPE_KEYS)
        for key in ("base", "agents"):
            if key not in data:
                raise InputError(f"{where}: {key}: missing; a recipe needs base and agents")
        listed = data["agents"]
        if not isinstance(listed, list) or not listed:
            raise InputError(
                f"{where}: agents: expected a list of agents (each a path, a Hub id, or "
                "name: and source:), found " + type_name(listed)
            )
        check_agent_count(len(listed))
        sources: list[str] = []
        given: list[str | None] = []
        for i, agent in enumerate(listed):
            at = f"agents[{i}]"
            if isinstance(agent, dict):
                known_keys(where, at + ".", agent, AGENT_KEYS)
                if "source" not in agent:
                    raise InputError(f"{where}: {at}: needs source: (a model folder, file or Hub id)")
                sources.append(text_value(where, at + ".source", agent["source"]))
                name = agent.get("name")
                given.append(text_value(where, at + ".name", name) if name is not None else None)
            else:
                sources.append(text_value(where, at, agent))
                given.append(None)
        derived = derive_names(sources)
        if all(given):
            chosen: list[str] | None = [str(g) for g in given]
        elif version == FORMAT_V1:
            chosen = None  # /1: the names counted only when every agent had one (else the engine derived them all)
        else:
            chosen = [g or d for g, d in zip(given, derived)]
        try:
            agents = make_agents(sources, chosen)
        except InputError as e:
            raise InputError(f"{where}: agents: {e}") from None
        names = [a.name for a in agents]
        method = text_value(where, "method", data.get("method", defaults.METHOD))
        params = data.get("parameters")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise InputError(f"{where}: parameters: expected a mapping of name: value, found {type_name(params)}")
        check_parameters(where, method, params)
        shared, own = _read_params(where, "", version, method, params, names)
        eps = data.get("eps", defaults.EPS)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise InputError(f"{where}: eps: expected a number, found {eps!r}")
        shard_size = data.get("shard_size", defaults.SHARD_SIZE)
        if isinstance(shard_size, bool) or not isinstance(shard_size, (str, int)):
            raise InputError(f"{where}: shard_size: expected a size like 5GB, found {shard_size!r}")
        slices = None
        if data.get("slices") is not None:
            checked = read_slices(where, method, data["slices"], len(sources))
            slices = tuple(
                {**s, "parameters": _slice_params(where, f"slices[{i}].", version, method, s["parameters"], names)}
                if "parameters" in s
                else s
                for i, s in enumerate(checked)
            )
        output = data.get("output")
        return cls(
            base=text_value(where, "base", data["base"]),
            agents=tuple(dataclasses.replace(a, params=o) for a, o in zip(agents, own)),
            method=method,
            params=shared,
            eps=float(eps),
            out_dtype=text_value(where, "out_dtype", data.get("out_dtype", defaults.OUT_DTYPE)),
            vocab=text_value(where, "vocab", data.get("vocab", defaults.VOCAB)),
            tokenizer=read_tokenizer(where, data.get("tokenizer")),
            chat_template=read_chat_template(f"{where}: chat_template", data.get("chat_template")),
            slices=slices,
            device=text_value(where, "device", data.get("device", defaults.DEVICE)),
            shard_size=str(shard_size),
            output=text_value(where, "output", output) if output else None,
        )


def _read_params(
    where: str, at: str, version: str, method: str, params: dict[str, Any], names: list[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A recipe's parameters split into those for every agent and each agent's own: /2 values keyed by agent
    name, checked; /1 lists by position."""
    per_agent = _per_agent_params(method)
    shared: dict[str, Any] = {}
    own: list[dict[str, Any]] = [{} for _ in names]
    for key, value in params.items():
        p = per_agent.get(key)
        if p is not None and _by_agent_name(p.setting, value, names):
            _check_keyed(f"{where}: {at}", key, p.setting, value, names)
            for name, item in value.items():
                own[names.index(str(name))][key] = item
        elif version == FORMAT_V1:
            try:
                one, each = split_params(method, {key: value}, names, f"{where}: {at}")
            except InputError as e:
                raise InputError(str(e)) from None
            shared.update(one)
            for values, more in zip(own, each):
                values.update(more)
        elif p is not None and value is not None and not p.setting:
            raise InputError(
                f"{where}: {at}parameters.{key}: expected one value per agent by name, like "
                f"{{{names[0]}: ...}} ({FORMAT} keys per-agent values by agent name)"
            )
        else:
            shared[key] = value
    return shared, own


def _slice_params(
    where: str, at: str, version: str, method: str, params: dict[str, Any], names: list[str]
) -> dict[str, Any]:
    """A layer map's parameters, checked, in the map's form (per-agent values keyed by agent name): /2 as
    written, /1 lists keyed by position."""
    split = _read_params(where, at, version, method, params, names)
    return _keyed(params, split, names) if version == FORMAT_V1 else params


def _keyed(
    order: Iterable[str], split: tuple[dict[str, Any], list[dict[str, Any]]], names: Sequence[str]
) -> dict[str, Any]:
    """Split parameters joined again in a layer map's form, in the keys' ``order``: each per-agent value keyed
    by agent name."""
    shared, own = split
    out: dict[str, Any] = {}
    for key in order:
        if any(key in values for values in own):
            out[key] = {n: values[key] for n, values in zip(names, own) if key in values}
        else:
            out[key] = shared[key]
    return out


def _keyed_slices(
    method: str, slices: Sequence[Mapping[str, Any]] | None, names: list[str]
) -> tuple[Mapping[str, Any], ...] | None:
    if slices is None:
        return None
    return tuple(
        {**s, "parameters": _keyed(s["parameters"], split_params(method, dict(s["parameters"]), names), names)}
        if s.get("parameters") is not None
        else dict(s)
        for s in slices
    )
