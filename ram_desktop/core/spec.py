"""``MergeSpec``: the one description of a merge, shared by the command line, the window, comparisons,
mergekit import and export, and the recipe file ``ram-recipe.yaml`` (its YAML, docs/contracts.md).

A spec is frozen. Its agents each carry a name, and every per-agent parameter value is keyed by that name
(``weight: {coder: 0.1, tool: 0.2}``), never by position: adding, removing, reordering or renaming agents
(``with_agents``) keeps each agent's values with it. The engine works on lists in agent order; ``engine_params``
is the one place that turns the keyed values into them. What only affects how a merge runs, not what it
makes (overwrite, chunk size, the probe cache, the Hub token, the fused kernels), is ``RunOptions``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import defaults
from .engine.chunks import DEFAULT_CHUNK_ELEMENTS
from .engine.plan import Layout, check_agent_count
from .errors import InputError, NoAgents, NoBase, NoOutput
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
    """One fine-tuned model: its name (unique in a spec; it keys the agent's per-agent values) and source."""

    name: str
    source: str


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


def _is_filter(value: Mapping, names: Sequence[str]) -> bool:
    """A setting's ``{filter:, value:}`` mapping rather than one keyed by agent name."""
    keys = {str(k) for k in value}
    return keys <= {"filter", "value"} and not keys <= set(names)


def key_by_agent(method: str, params: Mapping[str, Any], names: Sequence[str], where: str = "") -> dict[str, Any]:
    """``params`` with every per-agent list (or comma-separated text) in agent order keyed by agent name; one
    value for every agent (a setting's) and mappings are kept. A list of the wrong length is refused."""
    per_agent = _per_agent_params(method)
    out: dict[str, Any] = {}
    for key, value in params.items():
        p = per_agent.get(key)
        if p is None or value is None or isinstance(value, Mapping):
            out[key] = dict(value) if isinstance(value, Mapping) else value
            continue
        if isinstance(value, str):
            pairs = [item.partition("=") for item in value.split(",")]
            if all(eq and k.strip() in names for k, eq, _ in pairs):  # NAME=VALUE,... keyed on the command line
                out[key] = {k.strip(): v.strip() for k, _, v in pairs}
                continue
            if p.setting and "," not in value:
                out[key] = value  # one value for every agent
                continue
            items: list[Any] = [v.strip() for v in value.split(",")]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            if p.setting:
                out[key] = value
                continue
            items = [value]
        if len(items) != len(names):
            raise InputError(
                f"{where}{p.flag if not where else 'parameters.' + key}: {len(items)} values for {len(names)} agents "
                f"({', '.join(names)}); give one per agent, in agent order"
            )
        out[key] = {n: v for n, v in zip(names, items)}
    return out


def positional(method: str, params: Mapping[str, Any], names: Sequence[str], where: str = "") -> dict[str, Any]:
    """The engine's form of ``params``: each keyed per-agent value as a list in the order of ``names`` (an agent
    without a value gets None, a setting's default; a parameter that every agent needs refuses it)."""
    per_agent = _per_agent_params(method)
    out: dict[str, Any] = {}
    for key, value in params.items():
        p = per_agent.get(key)
        if p is None or value is None:
            out[key] = value
            continue
        if not isinstance(value, Mapping) or p.setting and _is_filter(value, names):
            # one value for every agent: a setting (a gradient list is repeated, a list being per agent there)
            out[key] = [value] * len(names) if isinstance(value, (list, tuple)) and p.setting else value
            continue
        unknown = [str(k) for k in value if str(k) not in names]
        if unknown:
            raise InputError(
                f"{where}parameters.{key}.{unknown[0]}: no agent of that name; the agents are {', '.join(names)}"
            )
        keyed = {str(k): v for k, v in value.items()}
        missing = [n for n in names if keyed.get(n) is None]
        if missing and not p.setting:
            raise InputError(f"{where}parameters.{key}: no value for agent {missing[0]}; give one for every agent")
        out[key] = [keyed.get(n) for n in names]
    return out


@dataclass(frozen=True)
class MergeSpec:
    """A merge (see the module docstring). ``params``: the method's parameters as given (keyed per agent);
    ``slices``: a layer map (docs/contracts.md, "slices"; model 0 is the base, i the i-th agent), None for
    whole models; ``output``: the folder written (None: not chosen yet)."""

    base: str = ""
    agents: tuple[Agent, ...] = ()
    method: str = defaults.METHOD
    params: Mapping[str, Any] = field(default_factory=dict)
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
        return cls(
            base=str(base),
            agents=made,
            method=method,
            params=key_by_agent(method, dict(params or {}), keyed_names),
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

    def with_agents(self, agents: Sequence[Agent], renamed: Mapping[str, str] | None = None) -> MergeSpec:
        """The spec with these agents (added, removed, reordered); each kept agent's per-agent values follow it,
        a removed agent's are dropped. ``renamed``: old name -> new name, whose values move to the new name."""
        renamed = dict(renamed or {})
        per_agent = _per_agent_params(self.method)
        params: dict[str, Any] = {}
        for key, value in self.params.items():
            if key in per_agent and isinstance(value, Mapping):
                moved = {renamed.get(str(k), str(k)): v for k, v in value.items()}
                params[key] = {a.name: moved[a.name] for a in agents if a.name in moved}
            else:
                params[key] = value
        make_agents([a.source for a in agents], [a.name for a in agents])  # unique, non-empty names
        return dataclasses.replace(self, agents=tuple(agents), params=params)

    def with_method(self, method: str, params: Mapping[str, Any]) -> MergeSpec:
        """Another method on the same inputs (a comparison's variant); per-agent lists are keyed here."""
        return dataclasses.replace(self, method=method, params=key_by_agent(method, dict(params), self.names))

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
        """The parameters as the engine takes them: per-agent values as lists in agent order."""
        return positional(self.method, self.params, self.names)

    def engine_slices(self) -> list[dict[str, Any]] | None:
        """The layer map with each slice's per-agent parameters as lists in agent order."""
        if self.slices is None:
            return None
        out = []
        for i, s in enumerate(self.slices):
            entry: dict[str, Any] = {"sources": [dict(x) for x in s["sources"]]}
            if s.get("parameters") is not None:
                entry["parameters"] = positional(self.method, s["parameters"], self.names, f"slices[{i}].")
            out.append(entry)
        return out

    def resolved_params(self) -> dict[str, Any]:
        """The method's parameters in the engine's form with its defaults filled in, validated (``InputError``)."""
        from .methods import get_method

        return get_method(self.method).resolve(self.engine_params())

    def resolved(self) -> MergeSpec:
        """This spec with every parameter stated (defaults filled in, values validated), keyed per agent."""
        return dataclasses.replace(self, params=key_by_agent(self.method, self.resolved_params(), self.names))

    # --- the recipe file -----------------------------------------------------------------------------
    def to_yaml(self) -> str:
        data: dict[str, Any] = {
            "format": FORMAT,
            "method": self.method,
            "parameters": _plain(self.params),
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
            data["tokenizer"] = _plain(self.tokenizer)
        if self.chat_template is not None:
            data["chat_template"] = self.chat_template
        if self.slices is not None:
            data["slices"] = _plain(list(self.slices))
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
        params = _read_params(where, "", version, method, params, names)
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
                {**s, "parameters": _read_params(where, f"slices[{i}].", version, method, s["parameters"], names)}
                if "parameters" in s
                else s
                for i, s in enumerate(checked)
            )
        output = data.get("output")
        return cls(
            base=text_value(where, "base", data["base"]),
            agents=agents,
            method=method,
            params=params,
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
) -> dict[str, Any]:
    """A recipe's parameters keyed per agent: /1 lists by position; /2 mappings by name, checked."""
    per_agent = _per_agent_params(method)
    if version == FORMAT_V1:
        try:
            return key_by_agent(method, params, names, f"{where}: {at}")
        except InputError as e:
            raise InputError(str(e)) from None
    for key, value in params.items():
        p = per_agent.get(key)
        if p is None or value is None:
            continue
        if isinstance(value, dict) and not (p.setting and _is_filter(value, names)):
            positional(method, {key: value}, names, f"{where}: {at}")  # an unknown agent, a missing value
        elif not p.setting:
            raise InputError(
                f"{where}: {at}parameters.{key}: expected one value per agent by name, like "
                f"{{{names[0]}: ...}} ({FORMAT} keys per-agent values by agent name)"
            )
    return dict(params)


def _keyed_slices(
    method: str, slices: Sequence[Mapping[str, Any]] | None, names: list[str]
) -> tuple[Mapping[str, Any], ...] | None:
    if slices is None:
        return None
    return tuple(
        {**s, "parameters": key_by_agent(method, dict(s["parameters"]), names)}
        if s.get("parameters") is not None
        else dict(s)
        for s in slices
    )


def _plain(value: Any) -> Any:
    """``value`` with mappings and tuples as plain dicts and lists (what ``yaml.safe_dump`` writes)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
