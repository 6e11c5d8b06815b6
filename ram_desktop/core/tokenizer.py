"""The merged model's tokenizer and vocabulary rows, built the way mergekit 0.1.5 builds them.

A spec's ``tokenizer`` (``source``: ``base``, ``union`` or ``model:NAME``; ``tokens``; ``pad_to_multiple_of``)
makes a new vocabulary: ``base`` is the base's tokenizer without the tokens at or beyond its config's
``vocab_size``; ``union`` adds to it every token of every model (regular tokens first, then added tokens, the
first model's settings winning); ``model:NAME`` is that model's tokenizer. Tokens named under ``tokens`` are
added where missing. Every model's embedding and output head is then re-indexed to the new vocabulary before
the merge: a token a model has keeps that model's row; a token it lacks (or one ``force``d) gets a default row,
the same for every model: the named source's row (a model, a model's other token, or zeros), else the only
model that has it, else the base's row, else the mean of the models that have it, in the dtype of the inputs.
Rows added by ``pad_to_multiple_of`` are the mean of the vocabulary's rows. The output's ``vocab_size`` is the
new size, and the tokenizer is written by transformers (``save_pretrained``), as mergekit writes it.

``chat_template`` (a name under ``resources/chat_templates``, ``auto`` for the models' most common one, or a
Jinja string) is set on the written tokenizer; without a tokenizer source it is the base's tokenizer re-saved.

Where mergekit's result depends on Python's or Rust's hash order (its set of models, a vocabulary's
iteration order) this module takes the base first and then the agents in order, and a model's tokens by id.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .engine.plan import VOCAB_TENSOR
from .errors import InputError
from .lazy import torch
from .storage.formats import Checkpoint, lora
from .storage.formats.base import CODE_OF_NAME, TensorInfo, dtype_name
from .storage.formats.local import open_slices

log = logging.getLogger("ram_desktop")

TOKENIZER_KEYS = ("source", "tokens", "pad_to_multiple_of")
TOKEN_KEYS = ("source", "force")
TEMPLATES = Path(__file__).resolve().parent.parent / "resources" / "chat_templates"
AUTO = "auto"


def named_templates() -> list[str]:
    """The chat templates a merge can name (``auto`` besides)."""
    return sorted(p.stem for p in TEMPLATES.glob("*.jinja"))


# --- reading the settings ---------------------------------------------------------------------------------------


def read_tokenizer(where: str, value: Any) -> dict[str, Any] | None:
    """A ``tokenizer`` block checked and as plain data (``source`` always stated); None for none."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"{where}: tokenizer: expected a mapping with source, tokens, pad_to_multiple_of")
    for key in value:
        if key not in TOKENIZER_KEYS:
            raise InputError(f"{where}: tokenizer.{key}: unknown key (it takes {', '.join(TOKENIZER_KEYS)})")
    out: dict[str, Any] = {"source": read_tokenizer_source(f"{where}: tokenizer.source", value.get("source", "union"))}
    tokens = value.get("tokens")
    if tokens is not None:
        if not isinstance(tokens, dict):
            raise InputError(f"{where}: tokenizer.tokens: expected a mapping of token: {{source, force}}")
        out["tokens"] = {str(tok): _read_token(where, f"tokenizer.tokens.{tok}", rule) for tok, rule in tokens.items()}
    pad = value.get("pad_to_multiple_of")
    if pad is not None:
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < 1:
            raise InputError(f"{where}: tokenizer.pad_to_multiple_of: expected a positive whole number, got {pad!r}")
        out["pad_to_multiple_of"] = pad
    return out


def read_tokenizer_source(at: str, value: Any) -> str:
    """``base``, ``union`` or ``model:NAME`` (a mergekit file's bare model path is read as ``model:PATH``);
    ``at`` names the setting in messages."""
    if isinstance(value, dict) and "model" in value:  # mergekit's long form of a model reference
        value = value["model"]["path"] if isinstance(value["model"], dict) else value["model"]
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{at}: expected base, union or model:NAME, got {value!r}")
    text = value.strip()
    if text in ("base", "union"):
        return text
    name = text.removeprefix("model:").strip()
    if not name:
        raise InputError(f"{at}: model: names no model; write model:NAME (an agent's name or base)")
    return f"model:{name}"


def _read_token(where: str, key: str, rule: Any) -> dict[str, Any]:
    if rule is None:
        rule = {}
    if not isinstance(rule, dict):
        raise InputError(f"{where}: {key}: expected a mapping with source and force")
    for k in rule:
        if k not in TOKEN_KEYS:
            raise InputError(f"{where}: {key}.{k}: unknown key (it takes {', '.join(TOKEN_KEYS)})")
    out: dict[str, Any] = {}
    force = rule.get("force", False)
    if not isinstance(force, bool):
        raise InputError(f"{where}: {key}.force: expected true or false, got {force!r}")
    if force:
        out["force"] = True
    source = rule.get("source")
    if source is None:
        return out
    if isinstance(source, str) and source.strip():
        out["source"] = source.strip()
    elif isinstance(source, dict) and source.get("kind") == "zero" and set(source) == {"kind"}:
        out["source"] = {"kind": "zero"}
    elif isinstance(source, dict) and source.get("kind") == "model_token":
        extra = sorted(set(source) - {"kind", "model", "token", "token_id"})
        if extra:
            raise InputError(f"{where}: {key}.source.{extra[0]}: unknown key (model, token or token_id)")
        model = source.get("model")
        if not isinstance(model, str) or not model.strip():
            raise InputError(f"{where}: {key}.source.model: names no model")
        if ("token" in source) == ("token_id" in source):
            raise InputError(f"{where}: {key}.source: give one of token or token_id")
        entry: dict[str, Any] = {"kind": "model_token", "model": model.strip()}
        if "token" in source:
            entry["token"] = str(source["token"])
        else:
            token_id = source["token_id"]
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise InputError(f"{where}: {key}.source.token_id: expected a token index, got {token_id!r}")
            entry["token_id"] = token_id
        out["source"] = entry
    else:
        raise InputError(
            f"{where}: {key}.source: expected a model's name, {{kind: zero}} or "
            f"{{kind: model_token, model: NAME, token: TEXT}}, got {source!r}"
        )
    return out


def read_chat_template(at: str, value: Any) -> str | None:
    """A chat template checked: a shipped name, ``auto``, or a Jinja string that parses (mergekit's reading:
    text without ``{`` and without a line break is a name). ``at`` names the setting in messages."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{at}: expected a template name or a Jinja string, got {value!r}")
    if "{" not in value and "\n" not in value:
        if value != AUTO and value not in named_templates():
            raise InputError(
                f"{at}: {value!r} is not a named template; choose {AUTO}, {', '.join(named_templates())} "
                "or give a Jinja template"
            )
        return value
    if len(value) < 20 or "{" not in value:
        raise InputError(f"{at}: not a valid chat template (a name, or Jinja of at least 20 characters)")
    try:
        import jinja2
    except ImportError:
        raise InputError(f"{at}: needs jinja2 (pip install 'ram-desktop[eval]')") from None
    try:
        jinja2.Environment().parse(value)
    except jinja2.TemplateSyntaxError as e:
        raise InputError(f"{at}: the Jinja template does not parse (line {e.lineno}: {e.message})") from None
    return value


def template_text(name_or_text: str) -> str:
    """A named template's text, or the Jinja string itself."""
    if "{" not in name_or_text and "\n" not in name_or_text:
        return (TEMPLATES / f"{name_or_text}.jinja").read_text(encoding="utf-8")
    return name_or_text


# --- the models of a merge ----------------------------------------------------------------------------------------


@dataclass
class Models:
    """A merge's distinct models (an agent whose source is the base's is the base): ``checkpoints[r]`` is role r
    (0 the base, i agent i); ``referenced``: the distinct roles, base first; ``inputs``: the order mergekit
    hands a tensor's models to its method (the agents, then the base when it is not one of them)."""

    checkpoints: list[Checkpoint]
    names: list[str]
    sources: list[str]
    canonical: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        first: dict[str, int] = {}
        for role, source in enumerate(self.sources):
            self.canonical.append(first.setdefault(_same(source), role))

    @property
    def referenced(self) -> list[int]:
        return list(dict.fromkeys(self.canonical))

    @property
    def inputs(self) -> list[int]:
        order = list(dict.fromkeys(self.canonical[1:]))
        return order if 0 in order else [*order, 0]

    def label(self, role: int) -> str:
        return "base" if role == 0 else self.names[role - 1]

    def role(self, key: str, ref: str) -> int:
        """The model a reference names: ``base``, an agent's name, or a model's source as written."""
        if ref == "base":
            return 0
        if ref in self.names:
            return self.canonical[self.names.index(ref) + 1]
        for role, source in enumerate(self.sources):
            if _same(source) == _same(ref):
                return self.canonical[role]
        raise InputError(
            f"{key}: {ref!r} is not a model of this merge; name base or an agent ({', '.join(self.names)})"
        )


def _same(source: str) -> str:
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source.strip()


# --- the vocabulary --------------------------------------------------------------------------------------------------


@dataclass
class Vocabulary:
    """The output tokenizer (a transformers tokenizer), and when the vocabulary is rebuilt, each model's
    row for every new token id (``rows[role][id]``: its old id, -1 none, None past its vocab_size)."""

    tokenizer: Any
    models: Models
    rebuilt: bool = False
    rows: dict[int, dict[int, int | None]] = field(default_factory=dict)
    vocabs: dict[int, dict[str, int]] = field(default_factory=dict)
    tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    size: int = 0
    prefer_base: bool = True

    def aligned(self, scratch: Path, cast: str | None = None) -> tuple[Checkpoint, list[Checkpoint]]:
        """Every model with its vocabulary tensors re-indexed (written to ``scratch``) and ``vocab_size`` the
        new size. ``cast``: the dtype the method reads its inputs in (mergekit's ``dtype``), None: as stored."""
        ckpts = self.models.checkpoints
        base = ckpts[0]
        names = [n for n, t in base.tensors.items() if VOCAB_TENSOR.search(n) and t.is_float and len(t.shape) >= 1]
        inputs = self.models.inputs
        out: dict[int, dict[str, Any]] = {role: {} for role in inputs}
        for name in names:
            raw = {}
            for role in inputs:
                info = ckpts[role].tensors.get(name)
                if info is None:
                    raise InputError(
                        f"tokenizer: {ckpts[role].display} has no {name!r}, which the base has; "
                        "its vocabulary rows cannot be re-indexed"
                    )
                with open_slices(info.file) as handle:
                    tensor = handle.get_tensor(name)
                raw[role] = tensor.to(getattr(torch, cast)) if cast else tensor
            for role, tensor in self.align(name, raw).items():
                out[role][name] = tensor
        files: dict[int, Path] = {}
        from safetensors.torch import save_file

        for role, tensors in out.items():
            files[role] = scratch / f"vocabulary-{role}.safetensors"
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(files[role]))
        result = []
        for role, ckpt in enumerate(ckpts):
            own = self.models.canonical[role]
            table = dict(ckpt.tensors)
            for name, tensor in out[own].items():
                table[name] = TensorInfo(name, CODE_OF_NAME[dtype_name(tensor.dtype)], tuple(tensor.shape), files[own])
            result.append(
                replace(ckpt, tensors=table, files=[*ckpt.files, files[own]], config=_resized(ckpt.config, self.size))
            )
        return result[0], result[1:]

    def align(self, name: str, tensors: dict[int, Any]) -> dict[int, Any]:
        """One vocabulary tensor of every input model (by role, vocabulary first) on the new vocabulary."""
        models = list(tensors)
        shape = tuple(tensors[models[0]].shape[1:])
        if any(tuple(t.shape[1:]) != shape for t in tensors.values()):
            raise InputError(f"tokenizer: {name!r} differs in its non-vocabulary dimensions between the models")
        dtype = tensors[models[0]].dtype
        for t in tensors.values():
            dtype = torch.promote_types(dtype, t.dtype)
        vocab = self.tokenizer.get_vocab()
        rules = self._rules(models, vocab)
        defaults: dict[str, Any] = {}
        for token, tid in vocab.items():
            rule = rules.get(token)
            if not (rule and rule.get("force")) and all(self._row(m, tid, token) >= 0 for m in models):
                continue
            if rule is None:
                continue
            defaults[token] = self._default(name, token, tid, rule, tensors, models, shape, dtype)
        result = {}
        for m in models:
            new = torch.zeros((self.size, *shape), dtype=dtype)
            ids, olds = [], []
            for token, tid in vocab.items():
                forced = bool(rules.get(token, {}).get("force"))
                old = self._row(m, tid, token)
                if old >= 0 and not forced:
                    ids.append(tid)
                    olds.append(old)
                elif token in defaults:
                    new[tid] = defaults[token]
                else:
                    log.warning(
                        "tokenizer: no row for token %r in %s (zeros)", token, self.models.checkpoints[m].display
                    )
            if ids:
                new[torch.tensor(ids)] = tensors[m].to(dtype)[torch.tensor(olds)]
            if self.size > len(vocab):  # padding rows: the mean of the vocabulary's rows
                new[len(vocab) :] = torch.mean(new[: len(vocab)], dim=0)
            result[m] = new
        return result

    def _row(self, model: int, tid: int, token: str) -> int:
        row = self.rows[model].get(tid, -1)
        if row is None:
            raise InputError(
                f"tokenizer: token {token!r} has index {self.vocabs[model].get(token)} in "
                f"{self.models.checkpoints[model].display}, past its vocab_size; mergekit 0.1.5 cannot merge "
                "this either (name the token under tokenizer.tokens with source and force, or use union)"
            )
        return row

    def _rules(self, models: list[int], vocab: dict[str, int]) -> dict[str, dict[str, Any]]:
        """Each token's rule: the named ones, then the default source of every token some model lacks."""
        rules = {tok: dict(rule) for tok, rule in self.tokens.items()}
        for token, tid in vocab.items():
            if token in rules:
                continue
            has = [self._row(m, tid, token) >= 0 for m in models]
            if sum(has) == 1:
                rules[token] = {"source": models[has.index(True)]}
            elif sum(has) == 0:
                log.warning("tokenizer: token %r is in none of the models (zeros)", token)
                rules[token] = {"source": {"kind": "zero"}}
            elif self.prefer_base and 0 in models and self._row(0, tid, token) >= 0:
                rules[token] = {"source": 0}
            else:
                rules[token] = {"average": True}
        return rules

    def _default(
        self, name: str, token: str, tid: int, rule: dict, tensors: dict, models: list[int], shape: tuple, dtype: Any
    ) -> Any:
        if rule.get("average"):
            embed = torch.zeros(shape, dtype=dtype)
            count = 0
            for m in models:
                row = self._row(m, tid, token)
                if row < 0:
                    continue
                embed = embed + tensors[m][row]
                count += 1
            embed /= count
            return embed
        source = rule.get("source")
        where = f"tokenizer.tokens.{token}.source"
        if source is None:
            raise InputError(f"{where}: missing; token {token!r} needs a source (a model, or {{kind: zero}})")
        if isinstance(source, dict) and source.get("kind") == "zero":
            return torch.zeros(shape, dtype=tensors[models[0]].dtype)
        model = source["model"] if isinstance(source, dict) else source
        role = model if isinstance(model, int) else self.models.role(where, model)
        label = self.models.label(role)
        if role not in tensors:
            raise InputError(f"{where}: {label} has no {name!r}")
        if isinstance(source, dict):  # a model's other token
            given = source.get("token_id")
            if given is None:
                if source["token"] not in self.vocabs.get(role, {}):
                    raise InputError(f"{where}.token: {source['token']!r} is not a token of {label}")
                given = self.vocabs[role][source["token"]]
            if not 0 <= int(given) < tensors[role].shape[0]:
                raise InputError(f"{where}.token_id: {given} is out of range for {label}")
            return tensors[role][int(given)]
        row = self._row(role, tid, token)
        if row < 0:
            raise InputError(f"{where}: token {token!r} is not in {label}")
        return tensors[role][row]

    def save(self, folder: Path, chat_template: str | None) -> None:
        """The tokenizer files, as mergekit writes them (``save_pretrained``), the chat template set."""
        template = self._template(chat_template)
        if template is not None:
            self.tokenizer.chat_template = template
        self.tokenizer.save_pretrained(str(folder), safe_serialization=True)

    def _template(self, chat_template: str | None) -> str | None:
        if not chat_template:
            return None
        if chat_template != AUTO:
            return template_text(chat_template)
        found = []
        for role in self.models.referenced:
            try:
                template = _load(self.models.checkpoints[role].folder).chat_template
            except Exception as e:  # noqa: BLE001 - mergekit skips a model whose tokenizer does not load
                log.warning("chat_template auto: cannot load the tokenizer of %s (%s)", self.models.sources[role], e)
                continue
            if isinstance(template, dict):
                template = template.get("default")
            if template:
                found.append(template.strip())
        return Counter(found).most_common(1)[0][0] if found else None


def _resized(config: dict | None, size: int) -> dict | None:
    if config is None:
        return None
    if "vocab_size" not in config and isinstance(config.get("text_config"), dict):
        return {**config, "text_config": {**config["text_config"], "vocab_size": size}}
    return {**config, "vocab_size": size}


def _load(folder: Path, **kwargs: Any) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise InputError("tokenizer: needs transformers (pip install 'ram-desktop[eval]')") from None
    # a local folder (a Hub source is in the cache by now): never a download; tokenizer_config.json records it
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, **kwargs)


def _vocab_size(ckpt: Checkpoint, tokenizer: Any) -> int:
    config = ckpt.config or {}
    size = config.get("vocab_size")
    if size is None and isinstance(config.get("text_config"), dict):
        size = config["text_config"].get("vocab_size")
    return int(size) if isinstance(size, int) else len(tokenizer.get_vocab())


def _stripped(ckpt: Checkpoint) -> Any:
    """The base's tokenizer without the tokens at or past its ``vocab_size`` (BPE only, as in mergekit)."""
    try:
        tokenizer = _load(ckpt.folder, use_fast=True)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to load is the user's file
        raise InputError(f"tokenizer: cannot load the base's tokenizer from {ckpt.folder} ({e})") from None
    size = _vocab_size(ckpt, tokenizer)
    unused = {tok for tok, idx in tokenizer.get_vocab().items() if idx >= size}
    if not unused:
        return tokenizer
    data = json.loads(tokenizer._tokenizer.to_str())
    if data["model"]["type"] != "BPE":
        raise InputError(
            f"tokenizer: the base's tokenizer has tokens past vocab_size {size} and is {data['model']['type']}; "
            "only a BPE tokenizer can be trimmed"
        )
    import tokenizers

    data["added_tokens"] = [e for e in data["added_tokens"] if e["id"] < size]
    for tok in unused:
        data["model"]["vocab"].pop(tok, None)
    data["model"]["merges"] = [
        m for m in data["model"]["merges"] if not any(t in unused for t in (m.split(" ") if isinstance(m, str) else m))
    ]
    tokenizer._tokenizer = tokenizers.Tokenizer.from_str(json.dumps(data))
    return tokenizer


def _union(base: Any, tokenizers: dict[int, Any], models: Models) -> Any:
    """The base's tokenizer (a copy) with every other token of every model: regular tokens (each model's by
    id), then added tokens, the first model's settings for a token added by several."""
    regular: dict[str, None] = {}
    added: dict[str, Any] = {}
    for role, tok in tokenizers.items():
        size = _vocab_size(models.checkpoints[role], tok)
        for token, idx in sorted(tok.get_vocab().items(), key=lambda item: item[1]):
            if idx < size:
                regular.setdefault(token)
        for idx, info in tok.added_tokens_decoder.items():
            if idx < size and info.content not in added:
                added[info.content] = info
    with tempfile.TemporaryDirectory() as folder:
        base.save_pretrained(folder, legacy_format=False, safe_serialization=True)
        out = _load(Path(folder), use_fast=True)
    known = base.get_vocab()
    for token in regular:
        if token not in added and token not in known:
            out.add_tokens(token)
    for info in added.values():
        out.add_tokens(info)
    return out


def prepare(
    checkpoints: list[Checkpoint],
    names: list[str],
    sources: list[str],
    settings: dict[str, Any] | None,
    chat_template: str | None,
    prefer_base: bool = True,
) -> Vocabulary | None:
    """The output tokenizer of a merge (``checkpoints``: the base, then the agents), or None when the base's
    tokenizer files are copied unchanged (no settings, no chat template). ``InputError`` naming the key for a
    reference to a model not in the merge."""
    if settings is None and not chat_template:
        return None
    models = Models(checkpoints, names, sources)
    if settings is None:  # the base's tokenizer, re-saved with the chat template
        return Vocabulary(_load_checked(checkpoints[0]), models)
    source_role, tokens = _resolved(settings, models)
    for ckpt in checkpoints:
        if lora.is_lora(ckpt):
            raise InputError(
                f"tokenizer: {ckpt.display} is a LoRA adapter, which has no vocabulary of its own; "
                "merge it into its model first, or keep the base's tokenizer"
            )
    base = _stripped(checkpoints[0])
    loaded: dict[int, Any] = {0: base}
    for role in models.referenced[1:]:
        try:
            loaded[role] = _load(checkpoints[role].folder)
        except Exception as e:  # noqa: BLE001 - as mergekit: a model without a loadable tokenizer has the base's
            log.warning("tokenizer: cannot load the tokenizer of %s (%s); taking the base's", sources[role], e)
    if source_role is not None:
        out = _load_checked(checkpoints[source_role])
    elif settings["source"] == "base":
        out = base
    else:
        out = _union(base, loaded, models)
    existing = set(out.get_vocab())
    for token in tokens:
        if token not in existing:
            out.add_tokens(token)
            existing.add(token)
    vocab_out = out.get_vocab()
    rows: dict[int, dict[int, int | None]] = {}
    for role in models.referenced:
        model_vocab = loaded.get(role, base).get_vocab()
        size = _vocab_size(checkpoints[role], loaded.get(role, base))
        table: dict[int, int | None] = {}
        for token, new in vocab_out.items():
            old = model_vocab.get(token)
            table[new] = -1 if old is None else (old if old < size else None)
        rows[role] = table
    size = len(vocab_out)
    pad = settings.get("pad_to_multiple_of")
    if pad and size % pad:
        size += pad - size % pad
    return Vocabulary(
        out,
        models,
        rebuilt=True,
        rows=rows,
        vocabs={role: tok.get_vocab() for role, tok in loaded.items()},
        tokens=tokens,
        size=size,
        prefer_base=prefer_base,
    )


def check_references(settings: dict[str, Any] | None, names: list[str], sources: list[str]) -> None:
    """``InputError`` naming the key where the settings name a model that is not in the merge (``sources``: the
    base's, then the agents'), before anything is opened."""
    if settings is not None:
        _resolved(settings, Models([], names, sources))


def _resolved(settings: dict[str, Any], models: Models) -> tuple[int | None, dict[str, dict[str, Any]]]:
    """The tokenizer source's model (None for base and union) and the token rules, their models as roles."""
    source = settings["source"]
    source_role = models.role("tokenizer.source", source.removeprefix("model:")) if ":" in source else None
    tokens: dict[str, dict[str, Any]] = {}
    for token, rule in (settings.get("tokens") or {}).items():
        rule = dict(rule)
        src = rule.get("source")
        key = f"tokenizer.tokens.{token}.source"
        if isinstance(src, str):
            rule["source"] = models.role(key, src)
        elif isinstance(src, dict) and src.get("kind") == "model_token":
            rule["source"] = {**src, "model": models.role(key + ".model", src["model"])}
        tokens[token] = rule
    return source_role, tokens


def _load_checked(ckpt: Checkpoint) -> Any:
    try:
        return _load(ckpt.folder)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to load is the user's file
        raise InputError(f"tokenizer: cannot load the tokenizer of {ckpt.display} ({e})") from None
