"""The probe's file format outlives a move of its statistics: ``data/probe-cache-ram-probe-1.json`` is a probe cache
file (``ram-probe-cache/1``) as the code wrote it while RAM+'s λ* histograms were still counted by the engine
itself (``make_models`` with agents alpha 0.5 and beta 0.3, ε = 1e-5). It must still load as a complete probe, seal
again to the same bytes, and a probe of the same inputs now must write the same report, key for key, in the same
order: only the inputs' paths and modification times (the fingerprint, the sources, the checksum) differ."""

from __future__ import annotations

import json
from pathlib import Path

from ram_desktop.core import MergeSpec, RunOptions, pipeline
from ram_desktop.core.engine.probe import ProbeReport, cache_dir, load_cached, save_cached
from ram_desktop.core.methods import PROBE_STATISTICS
from ram_desktop.core.methods.ram_rescale import survival_histograms, survival_share

from .conftest import make_models

LITERAL = Path(__file__).parent / "data" / "probe-cache-ram-probe-1.json"


def test_a_probe_cached_earlier_loads_complete_and_seals_to_the_same_bytes():
    text = LITERAL.read_text()
    sealed = json.loads(text)
    fingerprint, eps = sealed["fingerprint"], sealed["eps"]
    path = cache_dir() / f"{fingerprint}-{eps!r}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    report = load_cached(fingerprint, eps, PROBE_STATISTICS)
    assert report is not None and report.complete and report.counted
    assert json.dumps(report.to_json()) == json.dumps(sealed["report"])
    histograms = survival_histograms(report)
    assert set(histograms) == {"bfloat16", "float16", "float32"}
    assert histograms["bfloat16"] == sealed["report"]["rescale_survival"]["hist"]["bfloat16"]
    assert 0.0 < survival_share(report, 0, "bfloat16", 1.5) <= 1.0
    path.unlink()
    save_cached(report)
    assert path.read_text() == text
    # the engine alone (no method's statistics) reads everything else of it
    bare = ProbeReport.from_json(sealed["report"])
    assert bare.statistics == {} and bare.inspect is not None
    assert "rescale_survival" not in bare.to_json() and survival_histograms(bare) == {}


def _anonymous(sealed: dict) -> str:
    """The sealed cache file's text without what depends on the inputs' paths and modification times."""
    report = sealed["report"]
    for agent in report["agents"]:
        agent["source"] = ""
    sealed["fingerprint"] = report["fingerprint"] = ""
    sealed["sha256"] = ""
    return json.dumps(sealed)


def test_a_probe_now_caches_what_was_cached_then(tmp_path):
    base, agents = make_models(tmp_path / "in", agents={"alpha": 0.5, "beta": 0.3})
    pipeline.probe(MergeSpec.build(str(base), [str(a) for a in agents], eps=1e-5, device="cpu"), RunOptions())
    (path,) = cache_dir().glob("*.json")
    assert _anonymous(json.loads(path.read_text())) == _anonymous(json.loads(LITERAL.read_text()))
