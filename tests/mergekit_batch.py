"""Run several mergekit configurations in one process of mergekit's own venv: what ``mergekit-yaml CONFIG OUT``
does for each (its ``scripts/run_yaml.py`` with default options), without paying Python's and torch's start-up
per configuration. Usage: ``<mergekit venv>/bin/python tests/mergekit_batch.py JOBS.json`` with JOBS.json a list of
``[config, out]`` pairs. This file runs under mergekit's interpreter only; the test suite never imports it."""

import json
import sys

import yaml
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.options import MergeOptions


def main() -> None:
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
