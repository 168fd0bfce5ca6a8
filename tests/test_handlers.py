"""The UI wires the model-bound handlers by name: their parameters, the names and the page agree."""

from __future__ import annotations

import inspect

from app import common
from app.tabs import explore, sweep
from app.ui import HUB_PAIR_SETTINGS, OFFLINE_PAIRS, build_demo, pair_controls
from decoding.models import PRESETS


def parameters(fn) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p not in ("request", "progress"))


def test_handler_parameters_are_the_named_inputs():
    assert parameters(explore.run_explore) == explore.EXPLORE_INPUTS
    assert parameters(sweep.run_sweep) == sweep.SWEEP_INPUTS


def test_the_page_wires_as_many_components_as_the_names_say():
    demo = build_demo()
    events = {d["api_name"]: d for d in demo.config["dependencies"]}
    generate, sweeping = events["generate"], events["sweep"]
    assert len(generate["inputs"]) == len(explore.EXPLORE_INPUTS)
    assert len(generate["outputs"]) == len(explore.EXPLORE_OUTPUTS) - 1 + explore.CHARTS
    assert len(sweeping["inputs"]) == len(sweep.SWEEP_INPUTS)
    # The sidebar's settings are the same components in both events.
    shared = [n for n in sweep.SWEEP_INPUTS if n != "prompt" and n in explore.EXPLORE_INPUTS]
    for name in shared:
        assert (
            generate["inputs"][explore.EXPLORE_INPUTS.index(name)]
            == sweeping["inputs"][sweep.SWEEP_INPUTS.index(name)]
        )


def test_pairs_name_a_target_and_a_draft_spec_that_the_sidebar_gives_back():
    """A pair names its draft as `build_draft` reads it; the controls it sets make that spec again."""
    for target, spec in (OFFLINE_PAIRS | HUB_PAIR_SETTINGS).values():
        assert target in PRESETS
        chosen, source, n_layers, draft_model = pair_controls(target, spec)
        assert chosen == target and source in common.DRAFT_SOURCES
        assert common.draft_spec(source, n_layers if isinstance(n_layers, int) else 0, draft_model) == spec
    assert pair_controls("smollm2-135m", "layers:10")[2:] == (10, None)
    specs = ["ngram", "head", "ngram+head", "suffix", "layers:7", "smollm2-135m"]
    sources = [common.spec_controls(spec)[0] for spec in specs]
    assert sorted(sources) == sorted(common.DRAFT_SOURCES)  # every source, each once
    assert [common.draft_spec(*common.spec_controls(spec)) for spec in specs] == specs


def test_a_sweep_runs_at_the_sidebars_k_except_over_k():
    """Comparing sources or tree sizes uses the sidebar's k; a sweep over k starts at "k from"."""
    settings = {name: None for name in sweep.SWEEP_INPUTS} | {
        "prompt": "Hello", "target": "smollm2-135m", "draft_source": list(common.DRAFT_SOURCES)[0],
        "n_layers": 4, "draft_model": "", "k": 4, "tree_nodes": 0, "branch": 2, "policy": "fixed",
        "confidence": 0.4, "temperature": 0, "top_k": 0, "top_p": 1, "seed": 0, "max_new_tokens": 16,
        "k_from": 1, "k_to": 3, "tree_sizes": "4, 8", "repeats": 1,
    }  # fmt: skip
    ks = {over: sweep.sweep_plan(settings | {"sweep_over": over})[0].k for over in sweep.SWEEP_OVER}
    assert ks == dict(zip(sweep.SWEEP_OVER, (1, 4, 1, 4)))
