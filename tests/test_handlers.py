"""The UI wires the model-bound handlers by name: their parameters, the names and the page agree."""

from __future__ import annotations

import inspect

from app import handlers as h
from app.ui import build_demo


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
