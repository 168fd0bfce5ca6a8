"""The layout: components, and which handler each event calls. Nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr

from decoding.core.tree import MAX_BRANCH, MAX_TREE_NODES
from decoding.errors import SpecLensError
from decoding.models import HUB_PAIRS, OFFLINE_PRESETS, PRESETS
from decoding.models.hub import hub_available
from decoding.models.memory import gpu_pairs, gpu_status
from decoding.settings.policies import K_MAX, K_MIN, POLICIES
from decoding.tools.sweep import MAX_REPEATS
from visualize.glossary import glossary_html, glossary_script, terms_html
from visualize.race import race_html
from visualize.timeline import empty_timeline_html

from . import common
from .examples import example_labels, example_prompts
from .tabs import explore, production, replay, sweep, theory, traffic

CSS_PATH = Path(__file__).resolve().parents[1] / "assets" / "speclens.css"
JS_PATH = CSS_PATH.with_suffix(".js")
MODEL = {"concurrency_limit": 1, "concurrency_id": "model"}  # one model-bound run at a time
PRIVATE = {"api_visibility": "private"}
# Phones: the sidebar starts closed, so the prompt and Run are the first things on the screen.
ON_LOAD_JS = """() => {
  if (window.innerWidth < 768) {
    const toggle = document.querySelector('.sidebar.open .toggle-button');
    if (toggle) toggle.click();
  }
}"""

# A good load: the refusals still on the screen (of a file refused before it) are no longer true.
CLEAR_REFUSALS_JS = """(...inputs) => {
  document.querySelectorAll('.toast-body.error .toast-close').forEach((b) => b.click());
  return inputs;
}"""
NEXT_ROUND_JS = (
    "(r) => Math.min(r + 1, Number(document.querySelector('#replay-round input[type=range]').max))"
)

# A pair names a target and a draft spec as `build_draft` reads it; the sidebar's draft
# controls follow from the spec (`pair_controls`), so their labels live in `DRAFT_SOURCES` only.
# The first is the page's default: the pair that was fastest on the dev prompts
# (scripts/bench-offline-default.sh, docs/trained-head.md).
OFFLINE_PAIRS = {
    "SmolLM2-135M · n-gram + trained head (offline)": ("smollm2-135m", "ngram+head"),
    "SmolLM2-135M · n-gram draft (offline)": ("smollm2-135m", "ngram"),
    "SmolLM2-135M · trained draft head (offline)": ("smollm2-135m", "head"),
    "SmolLM2-135M · its first 10 layers (offline)": ("smollm2-135m", "layers:10"),
    "Gemma-3-270M · n-gram draft (offline)": ("gemma3-270m", "ngram"),
    "Gemma-3-270M ← SmolLM2-135M, another tokenizer (offline)": ("gemma3-270m", "smollm2-135m"),
}
HUB_PAIR_SETTINGS = {
    f"{PRESETS[t].hub_id.split('/')[1]} ← {PRESETS[d].hub_id.split('/')[1]} (hub)": (t, d)
    for t, d in HUB_PAIRS
}


OWN_PAIR = "Your own choice (the target and draft set below)"


def pair_of(
    offered: dict[str, tuple[str, str]], target: str, source: str, n_layers: float, draft_model: str | None
) -> str:
    """The pair the sidebar's settings make now: an offered one, or OWN_PAIR once any of them differs."""
    try:
        spec = common.draft_spec(source, n_layers, draft_model or "")
    except SpecLensError:  # no draft model named yet: no offered pair
        return OWN_PAIR
    return next((label for label, pair in offered.items() if pair == (target, spec)), OWN_PAIR)


def pair_controls(target: str, spec: str) -> tuple:
    """What choosing a pair sets: the target, and the draft source, N and draft model of its spec."""
    source, n_layers, draft_model = common.spec_controls(spec)
    return target, source, gr.update() if n_layers is None else n_layers, draft_model


def gpu_pair_label(target: str, draft: str) -> str:
    name = PRESETS[target].hub_id.split("/")[1]
    if draft.startswith("head:"):
        return f"{name} ← EAGLE-3 head {draft.removeprefix('head:')} (GPU)"
    return f"{name} ← {PRESETS[draft].hub_id.split('/')[1]} (GPU)"


def offered_pairs(hub: bool, cuda: bool, free: int) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """The model pairs a server offers, as (target, draft spec) by label, and a line for each GPU pair
    that does not fit: the offline ones; the hub's where it can be reached; with CUDA and the hub,
    the GPU pairs whose weights fit the GPU's free memory (in place of the same hub pair)."""
    gpu, unfit = gpu_pairs(cuda and hub, free)
    hub_pairs = {label: pair for label, pair in HUB_PAIR_SETTINGS.items() if pair not in gpu} if hub else {}
    on_gpu = {gpu_pair_label(*pair): pair for pair in gpu}
    return OFFLINE_PAIRS | hub_pairs | on_gpu, [f"{gpu_pair_label(*p)}: {line}" for p, line in unfit.items()]


def pairs() -> tuple[dict[str, tuple[str, str]], list[str]]:
    """`offered_pairs` on this server: whether it reaches the hub, has CUDA, and how much is free there."""
    return offered_pairs(hub_available(), *gpu_status())


def presets() -> list[str]:
    """Targets and drafts offered by name: the offline presets, and the hub's where it can be reached."""
    return list(PRESETS) if hub_available() else OFFLINE_PRESETS


def _figures(n: int) -> list[gr.Plot]:
    plots = []
    for _ in range(n // 2):
        with gr.Row():
            plots += [gr.Plot(show_label=False), gr.Plot(show_label=False)]
    return plots


def build_demo() -> gr.Blocks:
    """The page: a sidebar of settings shared by every tab, then one function per tab."""
    # Gradio's own copies of downloads: every 10 minutes, those older than an hour go.
    with gr.Blocks(title="SpecLens — speculative decoding, visible", delete_cache=(600, 3600)) as demo:
        gr.Markdown(
            "# SpecLens\nA small **draft** guesses the next tokens; the **target** checks them all in one pass "
            "and keeps the ones it would have written itself. Watch every guess and every verdict."
        )
        demo.load(None, None, None, js=ON_LOAD_JS)
        settings = sidebar(demo)
        # Every tab stays in sight on a phone: on a screen too narrow for one line they wrap (CSS keeps
        # them on one line at 390 px) instead of hiding behind Gradio's "⋯" menu.
        with gr.Tabs(overflow_behavior="wrap"):
            with gr.Tab("Explore"):
                trace_state = explore_tab(demo, settings)
            with gr.Tab("Sweep"):
                sweep_tab(settings)
            with gr.Tab("Traffic"):
                traffic_tab(demo, settings)
            with gr.Tab("Theory") as tab:
                theory_tab(demo, settings["target"], tab)
            with gr.Tab("Replay"):
                replay_tab(demo)
            with gr.Tab("Production"):
                production_tab(trace_state)
        with gr.Accordion("Glossary: every figure the app shows", open=False, elem_id="glossary"):
            gr.HTML(glossary_html())
    return demo


def sidebar(demo: gr.Blocks) -> dict[str, gr.components.Component]:
    """The models and decoding settings, keyed by the names in `common.SETTINGS`."""
    with gr.Sidebar(label="Models and decoding"):
        offered, unfit = pairs()
        pair = gr.Dropdown([*offered, OWN_PAIR], value=list(offered)[0], label="Model pair", elem_id="pair")
        if unfit:  # GPU pairs this card has no room for, each in one line
            gr.Markdown("Not offered here: " + "; ".join(unfit) + ".", elem_id="pairs-unfit")
        s = _setting_controls()
    draft = [s["target"], s["draft_source"], s["n_layers"], s["draft_model"]]
    pair.change(
        lambda p: pair_controls(*offered[p]) if p in offered else [gr.skip()] * 4,
        pair,
        draft,
        api_visibility="private",
    )
    # A setting changed by hand: the pair box says the pair is no longer the one it named.
    gr.on([c.change for c in draft], lambda *v: pair_of(offered, *v), draft, pair, api_visibility="private")
    gr.on(
        [s["target"].change, demo.load],
        common.layer_range,
        [s["target"], s["n_layers"]],
        s["n_layers"],
        api_name="layer_range",
    )
    s["draft_source"].change(
        common.draft_controls,
        [s["draft_source"], s["draft_model"]],
        [s["n_layers"], s["draft_model"]],
        api_visibility="private",
    )
    s["policy"].change(
        lambda p: gr.update(visible=p in ("confidence", "entropy")),
        s["policy"],
        s["confidence"],
        api_visibility="private",
    )
    s["tree_nodes"].change(
        lambda n: gr.update(visible=n > 0), s["tree_nodes"], s["branch"], api_visibility="private"
    )
    return s


def _setting_controls() -> dict[str, gr.components.Component]:
    names = presets()
    target, source, _, _ = pair_controls(*next(iter(OFFLINE_PAIRS.values())))  # the default pair's
    return {
        "target": gr.Dropdown(
            names,
            value=target,
            allow_custom_value=True,
            label="Target (preset, folder or hub id)",
            elem_id="target",
        ),
        "draft_source": gr.Radio(
            list(common.DRAFT_SOURCES),
            value=source,
            label="Draft source",
            elem_id="source",
        ),
        # The range follows the target's layer count once it is known.
        "n_layers": gr.Slider(
            1, 29, value=10, step=1, label="N (first-N-layers draft)", visible=False, elem_id="n-layers"
        ),
        "draft_model": gr.Dropdown(names, value=None, allow_custom_value=True, **common.model_box(source)),
        "k": gr.Slider(K_MIN, K_MAX, value=4, step=1, label="k: tokens drafted per round (a tree's depth)"),
        "tree_nodes": gr.Slider(
            0,
            MAX_TREE_NODES,
            value=0,
            step=1,
            label="Tree nodes N (0 = a chain of k)",
            elem_id="tree-nodes",
        ),
        "branch": gr.Slider(
            1,
            MAX_BRANCH,
            value=2,
            step=1,
            label="Tree branching: candidates per expansion",
            visible=False,
        ),
        "policy": gr.Radio(list(POLICIES), value="fixed", label="Draft-length policy"),
        "confidence": gr.Slider(
            0.05, 0.95, value=0.4, step=0.05, label="Stop below predicted acceptance", visible=False
        ),
        "temperature": gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)"),
        "top_k": gr.Slider(0, 200, value=0, step=1, label="Top-k (0 = off)"),
        "top_p": gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p"),
        "seed": gr.Number(value=0, precision=0, label="Seed"),
        "max_new_tokens": gr.Slider(1, 512, value=64, step=1, label="Max new tokens", elem_id="max-new"),
    }


def explore_tab(demo: gr.Blocks, settings: dict) -> gr.State:
    """One run: the streamed timeline, a round explained, cards, charts and downloads. It opens on
    an example run. Returns the run's trace, which the Production tab counts too."""
    prompt = gr.Textbox(
        value=explore.default_prompt(), lines=3, max_lines=6, label="Prompt", elem_id="prompt"
    )
    with gr.Row(equal_height=True):
        compare = gr.Checkbox(value=True, label="Compare with plain decoding", min_width=160)
        run = gr.Button("Run", variant="primary", elem_id="run", min_width=80)
        stop = gr.Button("Stop", variant="stop", elem_id="stop", min_width=80)
    examples = gr.Examples(
        [[p] for p in example_prompts()],
        inputs=prompt,
        label="Examples (classroom, each with what it shows, and Spec-Bench)",
        example_labels=example_labels(),
    )
    status = gr.Markdown(elem_id="run-status", elem_classes="sl-status")
    views = {"timeline": gr.HTML(empty_timeline_html(), elem_id="timeline")}
    with gr.Row():
        views["round_slider"] = gr.Slider(1, 2, value=1, step=1, label="Explain round", elem_id="round")
    views["sentence"] = gr.Markdown(elem_classes="sl-sentence", elem_id="sentence")
    views["tree"] = gr.Plot(show_label=False, elem_id="tree-plot", visible=False)
    views["cards"] = gr.HTML(elem_id="cards")
    race = gr.HTML(race_html(None), elem_id="race")
    views["text"] = gr.Textbox(label="Output text", lines=4, elem_id="output")
    views["charts"] = _figures(explore.CHARTS)
    with gr.Accordion(
        "On a GPU: this run priced on a measured card (a prediction)", open=False, elem_id="on-gpu"
    ):
        on_gpu = gr.Markdown(explore.gpu_view(None), elem_id="on-gpu-table")
    with gr.Row():
        views["trace_json"] = gr.File(label="Trace JSON", elem_id="trace-json")
        views["trace_csv"] = gr.File(label="Token events CSV", elem_id="trace-csv")
    views["trace_state"] = gr.State()
    outputs = _wire(views, explore.EXPLORE_OUTPUTS)
    demo.load(explore.example_run, None, [*outputs, status], api_name="example_run")
    inputs = _wire({**settings, "prompt": prompt, "compare": compare}, explore.EXPLORE_INPUTS)
    # What showed the example (or the last run) clears when a run starts.
    cleared = {status: "", views["cards"]: "", views["timeline"]: empty_timeline_html("Decoding…")}
    _while_running(
        run, stop, (explore.check_explore, explore.run_explore), inputs, outputs, "generate", cleared
    )
    # A chosen example empties the views of the run before (another prompt's) and says what it is.
    examples.load_input_event.then(explore.chosen_example, prompt, [*outputs, status], **PRIVATE)
    views["trace_state"].change(explore.race_view, views["trace_state"], race, **PRIVATE)
    views["trace_state"].change(explore.gpu_view, views["trace_state"], on_gpu, **PRIVATE)
    views["round_slider"].change(
        explore.explain_round,
        [views["trace_state"], views["round_slider"]],
        [views["timeline"], views["sentence"], views["tree"]],
        api_name="explain_round",
    )
    return views["trace_state"]


def sweep_tab(settings: dict) -> None:
    """One prompt for every k in a range, or for every tree size at the sidebar's k, or every
    prompt of a workload for every k."""
    gr.Markdown(
        "Runs one prompt for every k in the range, or for every tree size at the sidebar's k, or every "
        "prompt of a workload for every k (per category: how much sooner its prompts all finish), or one "
        "prompt with each ticked draft source (then races them), with the models and sampling set on the left. Each setting runs *Repeats* times, each time "
        "right after a plain run of its own, the settings taking turns: the chart shows the median "
        "and, as bars, the lowest and highest."
    )
    inputs = {
        **settings,
        "prompt": gr.Textbox(value=example_prompts()[1], lines=3, label="Prompt", elem_id="sweep-prompt"),
    }
    with gr.Row():
        inputs["sweep_over"] = gr.Radio(
            list(sweep.SWEEP_OVER), value=sweep.SWEEP_OVER[0], label="Sweep over", elem_id="sweep-over"
        )
        inputs["k_from"] = gr.Slider(K_MIN, K_MAX, value=1, step=1, label="k from")
        # k 1-4 at 3 repeats: the default workload sweep (every category) fits the time budget.
        inputs["k_to"] = gr.Slider(K_MIN, K_MAX, value=4, step=1, label="k to", elem_id="k-to")
        inputs["tree_sizes"] = gr.Textbox(
            value="0, 4, 8, 16", label="Tree sizes N (0 = the chain)", elem_id="tree-sizes"
        )
        inputs["repeats"] = gr.Slider(1, MAX_REPEATS, value=3, step=1, label="Repeats", elem_id="repeats")
    inputs |= _workload_and_sources()
    with gr.Row():
        button = gr.Button("Sweep", variant="primary", elem_id="sweep")
        stop = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
    summary = gr.Markdown(elem_id="sweep-summary")
    with gr.Row():
        speedup_plot = gr.Plot(show_label=False, elem_id="speedup-plot")
        accept_plot = gr.Plot(show_label=False)
    race = gr.HTML(visible=False, elem_id="sweep-race")
    # Its columns show before the first sweep, so each header's definition can be read ahead.
    table = gr.Dataframe(
        headers=sweep.TABLE_HEADERS, label="Per setting", interactive=False, elem_id="sweep-table"
    )
    csv = gr.File(label="Sweep CSV")
    outputs = [speedup_plot, accept_plot, table, csv, summary, race]
    # What the last sweep showed clears when a new one starts: it may have swept something else.
    cleared = {speedup_plot: None, accept_plot: None, table: None, csv: None, summary: "*Sweeping…*"}
    cleared[race] = gr.update(value="", visible=False)
    _while_running(
        button,
        stop,
        (sweep.check_sweep, sweep.run_sweep),
        _wire(inputs, sweep.SWEEP_INPUTS),
        outputs,
        "sweep",
        cleared,
    )


def traffic_tab(demo: gr.Blocks, settings: dict) -> None:
    """Plain and speculative decoding of many requests at once, at each batch size and k."""
    gr.Markdown(
        "Does speculation still pay when many requests decode together? Spec-Bench's prompts are decoded "
        "plainly and then speculatively with the sidebar's pair, *B* at a time (a request that finishes "
        "leaves and the next joins), greedy chains at each batch size and k ticked here (the sidebar's k, "
        "tree, policy and sampling are not used), and timed side by side. Plain decoding at batch *B* "
        "already checks *B* rows a pass; speculation adds each request's draft to the same pass, which "
        "is nearly free only while the pass is bound by reading the weights. On 2 cores the defaults take "
        "a minute or two."
    )
    inputs = dict(settings)
    with gr.Row():
        inputs["batch_sizes"] = gr.CheckboxGroup(
            list(traffic.BATCH_SIZES), value=[1, 2, 4, 8], label="Batch sizes B", elem_id="batch-sizes"
        )
        inputs["ks"] = gr.CheckboxGroup(list(range(1, 7)), value=[2, 4], label="k", elem_id="batch-ks")
    with gr.Row():
        inputs["per_category"] = gr.Slider(
            1, 12, value=2, step=1, label="Prompts per category (6 categories)", elem_id="batch-per-category"
        )
        inputs["traffic_tokens"] = gr.Slider(
            8, 256, value=32, step=8, label="New tokens per request", elem_id="batch-tokens"
        )
        inputs["traffic_repeats"] = gr.Slider(1, 5, value=1, step=1, label="Repeats")
    with gr.Row():
        button = gr.Button("Measure", variant="primary", elem_id="traffic-run")
        stop = gr.Button("Stop", variant="stop", elem_id="traffic-stop")
    plot = gr.Plot(show_label=False, elem_id="traffic-plot")
    why = gr.Markdown(elem_id="traffic-why")
    with gr.Row():
        vllm = gr.Code(
            language="json", label="vLLM --speculative-config", buttons=["copy"], elem_id="traffic-vllm"
        )
        sglang = gr.Code(
            language="json",
            label="SGLang --speculative-adaptive-config file",
            buttons=["copy"],
            elem_id="traffic-sglang",
        )
    table = gr.Dataframe(label="Per batch size and k", interactive=False, elem_id="traffic-table")
    csv = gr.File(label="Traffic CSV")
    outputs = [plot, why, vllm, sglang, table, csv]
    cleared = {plot: None, why: "*Measuring…*", vllm: "", sglang: "", table: None, csv: None}
    # The tab opens on what was measured here for the sidebar's target, where it was.
    gr.on(
        [demo.load, settings["target"].change], traffic.open_measured, settings["target"], outputs, **PRIVATE
    )
    _while_running(
        button,
        stop,
        (traffic.check_traffic, traffic.run_traffic),
        _wire(inputs, traffic.TRAFFIC_INPUTS),
        outputs,
        "traffic",
        cleared,
    )


def _workload_and_sources() -> dict[str, gr.components.Component]:
    """The Sweep tab's other subjects: a workload (a category or your JSONL), or draft sources."""
    found = {}
    with gr.Row():
        found["workload"] = gr.Dropdown(
            sweep.workload_choices(),
            value=sweep.EVERY_CATEGORY,
            label="Workload (k over a workload)",
            elem_id="workload",
        )
        found["workload_file"] = gr.File(
            label=f"…or your own JSONL of prompts (optional 'category'; up to {sweep.MAX_WORKLOAD_PROMPTS})",
            file_types=[".jsonl"],
            elem_id="workload-file",
        )
    found["sources"] = gr.CheckboxGroup(
        list(common.DRAFT_SOURCES),
        value=list(common.DRAFT_SOURCES)[:3],
        label="Draft sources (each against plain runs of its own, at the k, N and model on the left)",
        elem_id="sources",
    )
    return found


def theory_tab(demo: gr.Blocks, target: gr.components.Component, tab: gr.Tab) -> None:
    """The cost model with sliders, this machine's measured verify cost, trees, and a simulation."""
    gr.Markdown(
        "Each drafted token is accepted with probability **α**; a draft step costs **c** target steps; "
        "checking γ+1 tokens costs **1 + b·γ** target steps (b near 0 on a large GPU; once V(n) is "
        "measured here, this machine's own cost replaces b's line, and moving b brings it back). A round "
        "yields (1 − α^(γ+1)) / (1 − α) tokens on average."
    )
    with gr.Row():
        alpha = gr.Slider(0.0, 0.99, value=0.7, step=0.01, label="α: acceptance")
        c = gr.Slider(0.0, 1.0, value=0.1, step=0.01, label="c: draft cost")
        growth = gr.Slider(0.0, 1.0, value=0.0, step=0.01, label="b: verify cost per extra token")
        gamma_max = gr.Slider(2, 16, value=12, step=1, label="γ up to")
    with gr.Row():
        measure_btn = gr.Button("Measure V(n) on this machine (the sidebar's target)", elem_id="measure")
        measured_text = gr.Markdown(elem_id="measured-text")
    source = gr.Radio([theory.MEASURED, theory.SLIDER], value=theory.MEASURED, label="V(n) from",
                      visible=False, elem_id="verify-source")  # fmt: skip
    found = gr.State()  # what the probe measured here for the sidebar's target
    measured = gr.State()  # the V(n) every view uses: `found`, or None for b's line
    theory_text = gr.Markdown()
    theory_plot = gr.Plot(show_label=False, elem_id="theory-plot")
    chain = [alpha, c, growth, gamma_max]
    best_gamma = (theory.run_theory, [*chain, measured], [theory_plot, theory_text])
    # b is not among the triggers: moving it first chooses b's line (below), then every view follows.
    gr.on([alpha.change, c.change, gamma_max.change], *best_gamma, api_name="theory")
    gr.Markdown("### Many requests at once")
    concurrency_text = gr.Markdown(elem_id="concurrency-text")
    concurrency_plot = gr.Plot(show_label=False, elem_id="concurrency-plot")
    concurrency = (theory.run_concurrency, [alpha, c, growth, measured], [concurrency_plot, concurrency_text])
    # The page's chart adds what the Traffic tab measured here for the target, where it did.
    overlaid = (theory.with_measured_batches, [target, alpha, c, growth, measured], concurrency[2])
    gr.on([alpha.change, c.change], *concurrency, api_name="concurrency").then(*overlaid, **PRIVATE)
    tab.select(*overlaid, **PRIVATE)  # a Traffic run since the page opened shows on coming back
    # The charts open on what the probe measured here for the sidebar's target, where it did.
    opened = gr.on(
        [demo.load, target.change],
        theory.open_verify,
        target,
        [found, measured, source, measured_text],
        api_name="cached_verify",
    )
    checked = measure_btn.click(theory.check_measure, target, None, **PRIVATE, **MODEL)
    measuring = checked.success(
        theory.measure_verify, target, [found, measured, source, measured_text], api_name="measure_verify",
        **MODEL,
    )  # fmt: skip
    trees = _tree_theory(alpha, c, growth, measured)
    picked = source.input(theory.pick_source, [source, found], measured, **PRIVATE)
    moved = growth.input(theory.slider_moved, found, [measured, source], **PRIVATE)
    for then in (opened.then, measuring.success, picked.then, moved.then):
        then(*best_gamma, **PRIVATE)
        then(*overlaid, **PRIVATE)
        then(*trees, **PRIVATE)
    _simulation(alpha)


def _tree_theory(alpha, c, growth, measured) -> tuple:
    """The Trees section; returns its (function, inputs, outputs) for the measured cost to rerun."""
    gr.Markdown(
        "### Trees\nA node's r-th candidate is the target's token with probability α (the first), "
        "**α₂** (the second), then less by α₂/α per rank; a node is accepted when its whole path is. "
        "The best tree of N nodes holds the N nodes most likely accepted."
    )
    with gr.Row():
        alpha2 = gr.Slider(0.0, 0.99, value=0.15, step=0.01, label="α₂: acceptance of the second choice")
        branch = gr.Slider(1, MAX_BRANCH, value=3, step=1, label="B: candidates per node")
        depth = gr.Slider(1, 8, value=4, step=1, label="tree depth")
    text = gr.Markdown(elem_id="tree-theory-text")
    plot = gr.Plot(show_label=False)
    trees = (theory.run_tree_theory, [alpha, alpha2, branch, depth, c, growth, measured], [plot, text])
    # b is not among the triggers: theory_tab's choice of V(n) reruns this, as the other views.
    gr.on([alpha.change, alpha2.change, branch.change, depth.change, c.change], *trees,
          api_name="tree_theory")  # fmt: skip
    return trees


def _simulation(alpha) -> None:
    gr.Markdown("### Simulate\nRandom rounds at acceptance α, no model: watch them arrive.")
    with gr.Row():
        gamma = gr.Slider(1, 10, value=4, step=1, label="k: tokens drafted per round")
        rounds = gr.Slider(1, 30, value=20, step=1, label="rounds")
        seed = gr.Number(value=0, precision=0, label="seed")
        button = gr.Button("Simulate", elem_id="simulate")
        stop = gr.Button("Stop", variant="stop", elem_id="sim-stop")
    sentence = gr.Markdown(elem_classes="sl-sentence")
    timeline = gr.HTML(empty_timeline_html("Press Simulate."), elem_id="sim-timeline")
    simulation = button.click(
        theory.run_simulation, [alpha, gamma, rounds, seed], [timeline, sentence], api_name="simulate"
    )
    # No model behind it: cancelling the generator is all a stop needs.
    stop.click(None, None, None, cancels=[simulation], api_visibility="private")


def replay_tab(demo: gr.Blocks) -> None:
    """A saved trace, round by round: no model needed. It opens on an example."""
    gr.Markdown("Open a saved trace: no model needed. Step through it round by round.")
    with gr.Row():
        # Any file reaches the app's own check: the browser's type filter would drop a refused file,
        # and Load would then load the example behind it in its place.
        upload = gr.File(label="Trace JSON", type="filepath", elem_id="upload")
        example = gr.Dropdown(
            list(common.example_traces()),
            value=explore.EXAMPLE_RUN,
            label="…or an example trace",
            elem_id="example",
        )
        load_btn = gr.Button("Load", variant="primary", elem_id="load")
    with gr.Row():
        prev_btn = gr.Button("◀ previous", elem_id="prev")
        step = gr.Slider(1, 2, value=1, step=1, label="Round", interactive=False, elem_id="replay-round")
        next_btn = gr.Button("next ▶", elem_id="next")
    sentence = gr.Markdown(elem_classes="sl-sentence", elem_id="replay-sentence")
    tree = gr.Plot(show_label=False, elem_id="replay-tree", visible=False)
    timeline = gr.HTML(empty_timeline_html("Load a trace."), elem_id="replay-timeline")
    cards = gr.HTML()
    figs = _figures(explore.CHARTS)
    state = gr.State()
    outputs = [state, step, timeline, sentence, tree, cards, *figs]
    upload.upload(replay.check_upload, upload, None, **PRIVATE)  # refused as it arrives; nothing changes
    checked = load_btn.click(replay.check_replay, [upload, example], None, **PRIVATE)
    checked.success(replay.load_replay, [upload, example], outputs, js=CLEAR_REFUSALS_JS, api_name="replay")
    demo.load(replay.load_replay, [upload, example], outputs, **PRIVATE)
    step.change(replay.replay_step, [state, step], [timeline, sentence, tree], api_name="replay_step")
    # In the browser: a click counts from the round the page shows now, however fast they come
    # (a round trip per click would start from a value a click before it had already moved).
    prev_btn.click(None, step, step, js="(r) => Math.max(1, r - 1)", **PRIVATE)
    next_btn.click(None, step, step, js=NEXT_ROUND_JS, **PRIVATE)


def production_tab(trace_state: gr.State) -> None:
    """A vLLM or SGLang deployment's metrics beside the current Explore run."""
    gr.Markdown(
        "Read a **vLLM** or **SGLang** deployment's speculative-decoding metrics: its "
        "`/metrics` URL, or a saved page (two saved pages: the interval between them). "
        "Mean acceptance length = 1 + accepted / drafts; per-position acceptance = accepted "
        "at that position / drafts, a draft being a round that drafted (vLLM's definitions). The "
        "current Explore run is shown beside it, counted the same way, and by its rounds as Explore counts them."
    )
    gr.HTML(
        terms_html(
            [
                "mean acceptance length",
                "drafts",
                "tokens per round",
                "acceptance rate",
                "per-position acceptance (vLLM)",
                "per-position acceptance (SpecLens)",
                "c",
                "b",
                "speedup",
            ]
        ),
        elem_id="prod-terms",
    )
    with gr.Row():
        url = gr.Textbox(label="Metrics URL", placeholder="http://host:8000/metrics", elem_id="metrics-url")
        page_a = gr.File(label="Saved page", type="filepath", elem_id="page-a")
        page_b = gr.File(label="Later page (optional)", type="filepath", elem_id="page-b")
    with gr.Row():
        c = gr.Slider(0.0, 1.0, value=0.05, step=0.01, label="c: draft cost per token (target steps)")
        b = gr.Slider(0.0, 1.0, value=0.0, step=0.01, label="b: verify cost per extra token (target steps)")
        button = gr.Button("Read", variant="primary", elem_id="read-metrics")
        example = gr.Button("Example: this run as a page", elem_id="prod-example")
    text = gr.Markdown(elem_id="prod-text")
    with gr.Row():
        positions = gr.Plot(show_label=False, elem_id="prod-positions")
        best_k = gr.Plot(show_label=False, elem_id="prod-best-k")
    page = gr.File(label="This SpecLens run as a metrics page", elem_id="prod-page")
    inputs = [url, page_a, page_b, c, b, trace_state]
    outputs = [positions, best_k, text, page]
    checked = gr.on(
        [button.click, c.release, b.release], production.check_production, inputs, None, **PRIVATE
    )
    checked.success(production.run_production, inputs, outputs, api_name="production")
    example.click(
        production.production_example,
        [c, b, trace_state],
        [positions, best_k, text, page],
        api_name="production_example",
    )


def _wire(components: dict, names: tuple[str, ...]) -> list:
    """The components in the order a handler names them; a name may stand for a list (the charts)."""
    wired = []
    for name in names:
        c = components[name]
        wired += c if isinstance(c, list) else [c]
    return wired


def _while_running(button, stop, check_and_run, inputs, outputs, api_name: str, cleared=None) -> None:
    """A model-bound event: its button is disabled while it runs, and Stop ends it at the next round.

    The settings are checked first, in a step with no outputs: a refused input shows its message
    alone, every view keeps what it showed, and the button comes back. Stop asks the run to end
    rather than cancelling the event, so a stopped run still shows every view of the rounds it
    finished.
    """
    check, fn = check_and_run
    disable = button.click(lambda: gr.update(interactive=False), None, button, **PRIVATE)
    checked = disable.then(check, inputs, None, **PRIVATE, **MODEL)
    ready = checked
    if cleared:  # only once the settings passed: a refused input leaves every view as it was
        ready = checked.success(lambda: list(cleared.values()), None, list(cleared), **PRIVATE)
    # The run's progress shows on its first view alone, so an error marks no other view.
    run = ready.success(fn, inputs, outputs, api_name=api_name, show_progress_on=outputs[:1], **MODEL)
    for step in (checked, run):
        step.failure(_enable, None, button, **PRIVATE)
    run.success(_enable, None, button, **PRIVATE)
    stop.click(common.request_stop, None, None, queue=False, api_name=f"stop_{api_name}")


def _enable():
    return gr.update(interactive=True)


def launch_options() -> dict:
    """127.0.0.1 here, 0.0.0.0 on Spaces; Gradio's own GRADIO_SERVER_* variables win."""
    options = {
        "css": CSS_PATH.read_text(),
        "head": f"{glossary_script()}<script>{JS_PATH.read_text()}</script>",
        "theme": gr.themes.Soft(),
    }
    if "GRADIO_SERVER_NAME" not in os.environ:
        options["server_name"] = "0.0.0.0" if os.environ.get("SPACE_ID") else "127.0.0.1"
    return options
