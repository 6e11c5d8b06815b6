"""Run several mergekit configurations in one process of mergekit's own venv: what ``mergekit-yaml CONFIG OUT``
does for each (its ``scripts/run_yaml.py`` with default options), without paying Python's and torch's start-up
per configuration. Usage: ``<mergekit venv>/bin/python tests/mergekit_batch.py JOBS.json`` with JOBS.json a list of
``[config, out]`` pairs. This file runs under mergekit's interpreter only; the test suite never imports it.

With RAM_MERGEKIT_YAML_ORDER=1 set, mergekit lists a configuration's models in the file's order (the base
first) instead of its set's order, which follows Python's string hashing and so changes from run to run: the
order in which a union tokenizer takes the models' added tokens, and ``chat_template: auto``'s tie-break."""

import json
import os
import sys

import yaml
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.options import MergeOptions


def _in_file_order(self: MergeConfiguration) -> list:
    """The base, then every model as the file names it, each once."""
    found = [self.base_model] if self.base_model else []
    found += [m.model for m in self.models or []]
    found += [src.model for s in self.slices or [] for src in s.sources]
    return list(dict.fromkeys(found))


def main() -> None:
    if os.environ.get("RAM_MERGEKIT_YAML_ORDER"):
        MergeConfiguration.referenced_models = _in_file_order
    with open(sys.argv[1], encoding="utf-8") as f:
        jobs = json.load(f)
    for config_file, out_path in jobs:
        options = MergeOptions()
        options.apply_global_options()
        with open(config_file, encoding="utf-8") as f:
            source = f.read()
        run_merge(
            MergeConfiguration.model_validate(yaml.safe_load(source)), out_path, options=options, config_source=source
        )


if __name__ == "__main__":
    main()
