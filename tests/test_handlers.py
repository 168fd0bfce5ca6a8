"""The UI wires the model-bound handlers by name: their parameters, the names and the page agree."""

from __future__ import annotations

import inspect

from app import handlers as h
from app.ui import HUB_PAIR_SETTINGS, OFFLINE_PAIRS, build_demo, pair_controls
from decoding.models import PRESETS


def parameters(fn) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p not in ("request", "progress"))


def test_handler_parameters_are_the_named_inputs():
    assert parameters(h.run_explore) == h.EXPLORE_INPUTS
    assert parameters(h.run_sweep) == h.SWEEP_INPUTS


def test_the_page_wires_as_many_components_as_the_names_say():
    demo = build_demo()
    events = {d["api_name"]: d for d in demo.config["dependencies"]}
    explore, sweep = events["generate"], events["sweep"]
    assert len(explore["inputs"]) == len(h.EXPLORE_INPUTS)
    assert len(explore["outputs"]) == len(h.EXPLORE_OUTPUTS) - 1 + h.CHARTS
    assert len(sweep["inputs"]) == len(h.SWEEP_INPUTS)
    # The sidebar's settings are the same components in both events.
    shared = [n for n in h.SWEEP_INPUTS if n != "prompt" and n in h.EXPLORE_INPUTS]
    for name in shared:
        assert explore["inputs"][h.EXPLORE_INPUTS.index(name)] == sweep["inputs"][h.SWEEP_INPUTS.index(name)]


def test_pairs_name_a_target_and_a_draft_spec_that_the_sidebar_gives_back():
    """A pair names its draft as `build_draft` reads it; the controls it sets make that spec again."""
    for target, spec in (OFFLINE_PAIRS | HUB_PAIR_SETTINGS).values():
        assert target in PRESETS
        chosen, source, n_layers, draft_model = pair_controls(target, spec)
        assert chosen == target and source in h.DRAFT_SOURCES
        assert h.draft_spec(source, n_layers if isinstance(n_layers, int) else 0, draft_model) == spec
    assert pair_controls("smollm2-135m", "layers:10")[2:] == (10, None)
    specs = ["ngram", "head", "ngram+head", "suffix", "layers:7", "smollm2-135m"]
    sources = [h.spec_controls(spec)[0] for spec in specs]
    assert sorted(sources) == sorted(h.DRAFT_SOURCES)  # every source, each once
    assert [h.draft_spec(*h.spec_controls(spec)) for spec in specs] == specs
