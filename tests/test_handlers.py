"""The UI wires the model-bound handlers by name: their parameters, the names and the page agree."""

from __future__ import annotations

import inspect

from app import common
from app.examples import classroom_examples, example_prompts
from app.tabs import explore, sweep
from app.tabs.replay import load_replay
from app.ui import HUB_PAIR_SETTINGS, OFFLINE_PAIRS, build_demo, pair_controls
from decoding.models import PRESETS
from decoding.trace import Trace


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


def cards_of(views: list) -> str:
    return views[explore.EXPLORE_OUTPUTS.index("cards")]


def test_a_replayed_example_says_on_its_cards_that_it_was_recorded_elsewhere_and_when():
    """The page opens on a run recorded on another machine: its cards say so, with where and when it
    was measured, and a run made here says nothing of the kind."""
    shown = explore.example_run()
    trace = Trace.load(common.example_traces()[explore.EXAMPLE_RUN])
    flag = (
        '<div class="sl-recorded">Recorded, not run on this machine: the example '
        f"assets/traces/{explore.EXAMPLE_RUN}.json, measured on {trace.meta.started[:10]} on a 2-core CPU."
    )
    assert cards_of(shown).startswith(flag) and shown[-1].startswith("**Example run**")
    assert "sl-recorded" not in cards_of(explore.explore_views(trace))  # a run made here
    replayed = next(v for v in load_replay(None, explore.EXAMPLE_RUN) if "sl-cards" in str(v))
    assert replayed.startswith(flag)
    uploaded = next(
        v for v in load_replay(common.example_traces()[explore.EXAMPLE_RUN], None) if "sl-cards" in str(v)
    )
    assert uploaded.startswith(
        f'<div class="sl-recorded">Recorded, not run on this machine: the file {explore.EXAMPLE_RUN}.json'
    )


def test_choosing_an_example_empties_the_run_before_and_says_what_the_example_is():
    """After a click on an example the prompt box holds another prompt than the run on show: nothing
    of that run stays (its cards, race, trace), and the status line names the example and where
    what its button says was measured, no longer "Example run … the prompt above"."""
    demo = build_demo()
    (chosen,) = [d for d in demo.fns.values() if getattr(d.fn, "__name__", "") == "chosen_example"]
    assert len(chosen.outputs) == len(explore.EXPLORE_OUTPUTS) - 1 + explore.CHARTS + 1  # and the status
    assert chosen.outputs[-1].elem_id == "run-status"
    example = next(e for e in classroom_examples() if e.outcome == "loses")
    views = explore.chosen_example(example.prompt)
    assert len(views) == len(chosen.outputs)
    assert cards_of(views) == "" and views[explore.EXPLORE_OUTPUTS.index("text")] == ""
    assert views[explore.EXPLORE_OUTPUTS.index("trace_state") + explore.CHARTS - 1] is None  # the race clears
    assert (
        "data-round" not in views[0]
        and views[explore.EXPLORE_OUTPUTS.index("sentence") + explore.CHARTS - 1] == explore.NO_RUN
    )
    status = views[-1]
    assert status.startswith(f"**Classroom example: speculation loses, {example.lesson}.**")
    assert (
        "2-core AMD EPYC" in status and "not runs on this machine" in status and "Example run" not in status
    )
    bench = example_prompts()[len(classroom_examples())]
    assert explore.chosen_example(bench)[-1].startswith("**Spec-Bench example** (")
