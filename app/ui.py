"""The layout: components, and which handler each event calls. Nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr

from decoding.core.tree import MAX_BRANCH, MAX_TREE_NODES
from decoding.models import HUB_PAIRS, OFFLINE_PRESETS, PRESETS
from decoding.settings.policies import K_MAX, K_MIN, POLICIES
from visualize.timeline import empty_timeline_html

from . import handlers as h
from .examples import example_prompts

CSS_PATH = Path(__file__).resolve().parents[1] / "assets" / "speclens.css"
DEFAULT_PROMPT = "Explain speculative decoding to a ten-year-old in three sentences."
MODEL = {"concurrency_limit": 1, "concurrency_id": "model"}  # one model-bound run at a time

# A pair sets everything it names: target, draft source, N, and the draft model.
PAIRS = {
    "SmolLM2-135M · n-gram draft (offline)": ("smollm2-135m", "n-gram (prompt lookup)", 10, None),
    "SmolLM2-135M · trained draft head (offline)": (
        "smollm2-135m",
        "trained draft head (EAGLE-3)",
        10,
        None,
    ),
    "SmolLM2-135M · its first 10 layers (offline)": (
        "smollm2-135m",
        "first N layers of the target",
        10,
        None,
    ),
    "Gemma-3-270M · n-gram draft (offline)": ("gemma3-270m", "n-gram (prompt lookup)", 10, None),
    "Gemma-3-270M ← SmolLM2-135M, another tokenizer (offline)": (
        "gemma3-270m",
        "separate draft model",
        10,
        "smollm2-135m",
    ),
    **{
        f"{PRESETS[t].hub_id.split('/')[1]} ← {PRESETS[d].hub_id.split('/')[1]} (hub)": (
            t,
            "separate draft model",
            10,
            d,
        )
        for t, d in HUB_PAIRS
    },
}


def _figures(n: int) -> list[gr.Plot]:
    plots = []
    for _ in range(n // 2):
        with gr.Row():
            plots += [gr.Plot(show_label=False), gr.Plot(show_label=False)]
    return plots


def build_demo() -> gr.Blocks:
    presets = list(PRESETS)
    # Gradio's own copies of downloads: every 10 minutes, those older than an hour go.
    with gr.Blocks(title="SpecLens — speculative decoding, visible", delete_cache=(600, 3600)) as demo:
        gr.Markdown(
            "# SpecLens\nA small **draft** guesses the next tokens; the **target** checks them all in one pass "
            "and keeps the ones it would have written itself. Watch every guess and every verdict."
        )
        with gr.Sidebar(label="Models and decoding"):
            pair = gr.Dropdown(list(PAIRS), value=list(PAIRS)[0], label="Model pair", elem_id="pair")
            target = gr.Dropdown(
                presets,
                value=OFFLINE_PRESETS[0],
                allow_custom_value=True,
                label="Target (preset, folder or hub id)",
            )
            source = gr.Radio(
                list(h.DRAFT_SOURCES), value="n-gram (prompt lookup)", label="Draft source", elem_id="source"
            )
            # The range follows the target's layer count once it is known.
            n_layers = gr.Slider(
                1, 29, value=10, step=1, label="N (first-N-layers draft)", visible=False, elem_id="n-layers"
            )
            draft_model = gr.Dropdown(
                presets,
                value=None,
                allow_custom_value=True,
                label="Draft model (another tokenizer drafts through text)",
                visible=False,
            )
            k = gr.Slider(K_MIN, K_MAX, value=4, step=1, label="k: tokens drafted per round (a tree's depth)")
            tree_nodes = gr.Slider(
                0,
                MAX_TREE_NODES,
                value=0,
                step=1,
                label="Tree nodes N (0 = a chain of k)",
                elem_id="tree-nodes",
            )
            branch = gr.Slider(
                1,
                MAX_BRANCH,
                value=2,
                step=1,
                label="Tree branching: candidates per expansion",
                visible=False,
            )
            policy = gr.Radio(list(POLICIES), value="fixed", label="Draft-length policy")
            confidence = gr.Slider(
                0.05, 0.95, value=0.4, step=0.05, label="Confidence cut-off", visible=False
            )
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
            top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k (0 = off)")
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
            seed = gr.Number(value=0, precision=0, label="Seed")
            max_new = gr.Slider(1, 512, value=64, step=1, label="Max new tokens", elem_id="max-new")
        pair.change(
            lambda p: PAIRS[p], pair, [target, source, n_layers, draft_model], api_visibility="private"
        )
        gr.on(
            [target.change, demo.load],
            h.layer_range,
            [target, n_layers],
            n_layers,
            api_name="layer_range",
        )
        source.change(h.draft_controls, source, [n_layers, draft_model], api_visibility="private")
        policy.change(
            lambda p: gr.update(visible=p == "confidence"), policy, confidence, api_visibility="private"
        )
        tree_nodes.change(lambda n: gr.update(visible=n > 0), tree_nodes, branch, api_visibility="private")

        with gr.Tabs():
            with gr.Tab("Explore"):
                prompt = gr.Textbox(value=DEFAULT_PROMPT, lines=3, label="Prompt", elem_id="prompt")
                gr.Examples(
                    [[p] for p in example_prompts()],
                    inputs=prompt,
                    label="Examples (classroom and Spec-Bench)",
                )
                with gr.Row():
                    compare = gr.Checkbox(value=True, label="Compare with plain decoding")
                    run = gr.Button("Run", variant="primary", elem_id="run")
                    stop = gr.Button("Stop", variant="stop", elem_id="stop")
                timeline = gr.HTML(empty_timeline_html(), elem_id="timeline")
                with gr.Row():
                    round_no = gr.Slider(1, 2, value=1, step=1, label="Explain round", elem_id="round")
                sentence = gr.Markdown(elem_classes="sl-sentence", elem_id="sentence")
                tree_plot = gr.Plot(show_label=False, elem_id="tree-plot")
                cards = gr.HTML(elem_id="cards")
                text = gr.Textbox(label="Output text", lines=4, elem_id="output")
                figs = _figures(4)
                with gr.Row():
                    json_file = gr.File(label="Trace JSON", elem_id="trace-json")
                    csv_file = gr.File(label="Token events CSV", elem_id="trace-csv")
                trace_state = gr.State()

            with gr.Tab("Draft-length sweep"):
                gr.Markdown(
                    "Runs one prompt for every k in the range, or for every tree size at the sidebar's k, "
                    "with the models and sampling set on the left."
                )
                sweep_prompt = gr.Textbox(value=example_prompts()[1], lines=3, label="Prompt")
                with gr.Row():
                    sweep_over = gr.Radio(
                        list(h.SWEEP_OVER), value=h.SWEEP_OVER[0], label="Sweep over", elem_id="sweep-over"
                    )
                    k_from = gr.Slider(K_MIN, K_MAX, value=1, step=1, label="k from")
                    k_to = gr.Slider(K_MIN, K_MAX, value=6, step=1, label="k to", elem_id="k-to")
                    tree_sizes = gr.Textbox(
                        value="0, 4, 8, 16", label="Tree sizes N (0 = the chain)", elem_id="tree-sizes"
                    )
                    sweep_btn = gr.Button("Sweep", variant="primary", elem_id="sweep")
                    sweep_stop = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
                sweep_summary = gr.Markdown(elem_id="sweep-summary")
                with gr.Row():
                    speedup_plot = gr.Plot(show_label=False, elem_id="speedup-plot")
                    accept_plot = gr.Plot(show_label=False)
                sweep_table = gr.Dataframe(label="Per k", interactive=False)
                sweep_csv = gr.File(label="Sweep CSV")

            with gr.Tab("Theory"):
                gr.Markdown(
                    "Each drafted token is accepted with probability **α**; a draft step costs **c** target steps; "
                    "checking γ+1 tokens costs **1 + b·γ** target steps (b = 0 on a GPU, well above 0 on these "
                    "CPUs). A round yields (1 − α^(γ+1)) / (1 − α) tokens on average."
                )
                with gr.Row():
                    alpha = gr.Slider(0.0, 0.99, value=0.7, step=0.01, label="α: acceptance")
                    c = gr.Slider(0.0, 1.0, value=0.1, step=0.01, label="c: draft cost")
                    growth = gr.Slider(0.0, 1.0, value=0.0, step=0.01, label="b: verify cost per extra token")
                    gamma_max = gr.Slider(2, 16, value=12, step=1, label="γ up to")
                with gr.Row():
                    measure_btn = gr.Button(
                        "Measure V(n) on this machine (the sidebar's target)", elem_id="measure"
                    )
                    measured_text = gr.Markdown(elem_id="measured-text")
                measured = gr.State()
                theory_text = gr.Markdown()
                theory_plot = gr.Plot(show_label=False)
                gr.Markdown(
                    "### Trees\nA node's r-th candidate is the target's token with probability α (the first), "
                    "**α₂** (the second), then less by α₂/α per rank; a node is accepted when its whole path is. "
                    "The best tree of N nodes holds the N nodes most likely accepted."
                )
                with gr.Row():
                    alpha2 = gr.Slider(
                        0.0, 0.99, value=0.15, step=0.01, label="α₂: acceptance of the second choice"
                    )
                    tree_branch = gr.Slider(1, MAX_BRANCH, value=3, step=1, label="B: candidates per node")
                    tree_depth = gr.Slider(1, 8, value=4, step=1, label="tree depth")
                tree_theory_text = gr.Markdown(elem_id="tree-theory-text")
                tree_theory_plot = gr.Plot(show_label=False)
                gr.Markdown("### Simulate\nRandom rounds at acceptance α, no model: watch them arrive.")
                with gr.Row():
                    sim_gamma = gr.Slider(1, 10, value=4, step=1, label="γ")
                    sim_rounds = gr.Slider(1, 30, value=8, step=1, label="rounds")
                    sim_seed = gr.Number(value=0, precision=0, label="seed")
                    sim_btn = gr.Button("Simulate", elem_id="simulate")
                    sim_stop = gr.Button("Stop", variant="stop", elem_id="sim-stop")
                sim_sentence = gr.Markdown(elem_classes="sl-sentence")
                sim_timeline = gr.HTML(empty_timeline_html("Press Simulate."), elem_id="sim-timeline")

            with gr.Tab("Replay"):
                gr.Markdown("Open a saved trace: no model needed. Step through it round by round.")
                with gr.Row():
                    upload = gr.File(
                        label="Trace JSON", file_types=[".json"], type="filepath", elem_id="upload"
                    )
                    example = gr.Dropdown(
                        list(h.example_traces()), label="…or an example trace", elem_id="example"
                    )
                    load_btn = gr.Button("Load", variant="primary", elem_id="load")
                with gr.Row():
                    prev_btn = gr.Button("◀ previous", elem_id="prev")
                    replay_round = gr.Slider(
                        1, 2, value=1, step=1, label="Round", interactive=False, elem_id="replay-round"
                    )
                    next_btn = gr.Button("next ▶", elem_id="next")
                replay_sentence = gr.Markdown(elem_classes="sl-sentence", elem_id="replay-sentence")
                replay_tree = gr.Plot(show_label=False, elem_id="replay-tree")
                replay_timeline = gr.HTML(empty_timeline_html("Load a trace."), elem_id="replay-timeline")
                replay_cards = gr.HTML()
                replay_figs = _figures(4)
                replay_state = gr.State()

            with gr.Tab("Production"):
                gr.Markdown(
                    "Read a **vLLM** or **SGLang** deployment's speculative-decoding metrics: its "
                    "`/metrics` URL, or a saved page (two saved pages: the interval between them). "
                    "Mean acceptance length = 1 + accepted / drafts; per-position acceptance = accepted "
                    "at that position / drafts (vLLM's definitions). The current Explore run is shown "
                    "beside it, counted the same way."
                )
                with gr.Row():
                    metrics_url = gr.Textbox(
                        label="Metrics URL", placeholder="http://host:8000/metrics", elem_id="metrics-url"
                    )
                    page_a = gr.File(label="Saved page", type="filepath", elem_id="page-a")
                    page_b = gr.File(label="Later page (optional)", type="filepath", elem_id="page-b")
                with gr.Row():
                    prod_c = gr.Slider(
                        0.0, 1.0, value=0.05, step=0.01, label="c: draft cost per token (target steps)"
                    )
                    prod_b = gr.Slider(
                        0.0, 1.0, value=0.0, step=0.01, label="b: verify cost per extra token (target steps)"
                    )
                    prod_btn = gr.Button("Read", variant="primary", elem_id="read-metrics")
                prod_text = gr.Markdown(elem_id="prod-text")
                with gr.Row():
                    prod_pos = gr.Plot(show_label=False, elem_id="prod-positions")
                    prod_k = gr.Plot(show_label=False, elem_id="prod-best-k")
                prod_page = gr.File(label="This SpecLens run as a metrics page", elem_id="prod-page")

        settings = {
            **{"target": target, "source": source, "n_layers": n_layers, "draft_model": draft_model},
            **{"k": k, "tree_nodes": tree_nodes, "branch": branch, "policy": policy},
            **{"confidence": confidence, "temperature": temperature},
            **{"top_k": top_k, "top_p": top_p, "seed": seed, "max_new": max_new},
        }
        explore_outputs = {
            **{"timeline": timeline, "text": text, "cards": cards, "charts": figs},
            **{"trace_json": json_file, "trace_csv": csv_file, "trace_state": trace_state},
            **{"round_slider": round_no, "sentence": sentence, "tree": tree_plot},
        }
        _while_running(
            run,
            stop,
            h.run_explore,
            _wire({**settings, "prompt": prompt, "compare": compare}, h.EXPLORE_INPUTS),
            _wire(explore_outputs, h.EXPLORE_OUTPUTS),
            "generate",
        )
        round_no.change(
            h.explain_round,
            [trace_state, round_no],
            [timeline, sentence, tree_plot],
            api_name="explain_round",
        )

        sweep_inputs = {
            **settings,
            "prompt": sweep_prompt,
            "sweep_over": sweep_over,
            "tree_sizes": tree_sizes,
        }
        sweep_inputs |= {"k_from": k_from, "k_to": k_to}
        _while_running(
            sweep_btn,
            sweep_stop,
            h.run_sweep,
            _wire(sweep_inputs, h.SWEEP_INPUTS),
            [speedup_plot, accept_plot, sweep_table, sweep_csv, sweep_summary],
            "sweep",
        )

        theory_inputs = [alpha, c, growth, gamma_max]
        gr.on(
            [x.change for x in theory_inputs] + [demo.load],
            h.run_theory,
            [*theory_inputs, measured],
            [theory_plot, theory_text],
            api_name="theory",
        )
        measure_btn.click(
            h.measure_verify, target, [measured, measured_text], api_name="measure_verify", **MODEL
        ).success(
            h.run_theory, [*theory_inputs, measured], [theory_plot, theory_text], api_visibility="private"
        )
        tree_theory_inputs = [alpha, alpha2, tree_branch, tree_depth, c, growth]
        gr.on(
            [x.change for x in tree_theory_inputs] + [demo.load],
            h.run_tree_theory,
            tree_theory_inputs,
            [tree_theory_plot, tree_theory_text],
            api_name="tree_theory",
        )
        simulation = sim_btn.click(
            h.run_simulation,
            [alpha, sim_gamma, sim_rounds, sim_seed],
            [sim_timeline, sim_sentence],
            api_name="simulate",
        )
        # No model behind it: cancelling the generator is all a stop needs.
        sim_stop.click(None, None, None, cancels=[simulation], api_visibility="private")

        load_btn.click(
            h.load_replay,
            [upload, example],
            [
                replay_state,
                replay_round,
                replay_timeline,
                replay_sentence,
                replay_tree,
                replay_cards,
                *replay_figs,
            ],
            api_name="replay",
        )
        replay_round.change(
            h.replay_step,
            [replay_state, replay_round],
            [replay_timeline, replay_sentence, replay_tree],
            api_name="replay_step",
        )
        prod_inputs = [metrics_url, page_a, page_b, prod_c, prod_b, trace_state]
        gr.on(
            [prod_btn.click, prod_c.release, prod_b.release],
            h.run_production,
            prod_inputs,
            [prod_pos, prod_k, prod_text, prod_page],
            api_name="production",
        )
        prev_btn.click(lambda r: max(1, r - 1), replay_round, replay_round, api_visibility="private")
        next_btn.click(lambda r: r + 1, replay_round, replay_round, api_visibility="private")
    return demo


def _wire(components: dict, names: tuple[str, ...]) -> list:
    """The components in the order a handler names them; a name may stand for a list (the charts)."""
    wired = []
    for name in names:
        c = components[name]
        wired += c if isinstance(c, list) else [c]
    return wired


def _while_running(button, stop, fn, inputs, outputs, api_name: str) -> None:
    """A model-bound event: its button is disabled while it runs, and Stop ends it at the next round.

    Stop asks the run to end rather than cancelling the event, so a stopped
    run still shows every view of the rounds it finished.
    """
    disable = button.click(lambda: gr.update(interactive=False), None, button, api_visibility="private")
    run = disable.then(fn, inputs, outputs, api_name=api_name, **MODEL)
    run.then(lambda: gr.update(interactive=True), None, button, api_visibility="private")
    stop.click(h.request_stop, None, None, queue=False, api_name=f"stop_{api_name}")


def launch_options() -> dict:
    """127.0.0.1 here, 0.0.0.0 on Spaces; Gradio's own GRADIO_SERVER_* variables win."""
    options = {"css": CSS_PATH.read_text(), "theme": gr.themes.Soft()}
    if "GRADIO_SERVER_NAME" not in os.environ:
        options["server_name"] = "0.0.0.0" if os.environ.get("SPACE_ID") else "127.0.0.1"
    return options
