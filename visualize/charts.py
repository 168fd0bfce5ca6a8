"""Trace / DataFrame -> Plotly figures. No model code here."""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Callable, Sequence

import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from decoding import costmodel
from decoding.trace import Trace

COLORS = {
    "accepted": "#2e9d5b",
    "rejected": "#d64545",
    "discarded": "#b8b8b8",
    "correction": "#e08a1e",
    "bonus": "#3a6fd8",
    "draft": "#8e6bd1",
    "verify": "#2a9bb0",
    "other": "#b0b0b0",
    "plain": "#777777",
}


INK = "#7d8797"  # 3.7:1 on white, 5:1 on Gradio's dark background
GRID = "rgba(128, 128, 128, 0.25)"


# Sized for a 360 px phone, whose charts are about 300 px wide and 200 px tall inside their axes:
# titles wrap at these many characters (of 15 px and 13 px type) rather than run off the chart.
TITLE_CHARS = 36
X_TITLE_CHARS = 42
Y_TITLE_CHARS = 28
# Plotly's toolbar (the modebar) is a row this tall along the chart's top: the title starts below it.
MODEBAR_PX = 34
LINE_PX = {"title": 20, "axis": 16}


def wrap(text: str, width: int) -> str:
    """`text` broken into lines of at most `width` characters (Plotly's <br>): Plotly never wraps."""
    return "<br>".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def _layout(fig: go.Figure, title: str, x: str, y: str, whole_x: bool = False) -> go.Figure:
    if whole_x:  # positions, counts and draft lengths are whole numbers
        fig.update_xaxes(dtick=1)
    title, x, y = wrap(title, TITLE_CHARS), wrap(x, X_TITLE_CHARS), wrap(y, Y_TITLE_CHARS)
    title_lines, x_lines = title.count("<br>") + 1, x.count("<br>") + 1
    top = MODEBAR_PX + LINE_PX["title"] * title_lines + 14
    bottom = 30 + LINE_PX["axis"] * x_lines
    if len(fig.data) > 1 or fig.layout.showlegend:  # room for the legend, below the axis title
        bottom += 2 * LINE_PX["axis"]
    fig.update_layout(
        # Below the toolbar's row: on a phone the toolbar spans the chart's width. Plotly anchors a
        # title of several lines half a line too high for each line after the first.
        title={
            "text": title,
            "x": 0,
            "xanchor": "left",
            "xref": "container",
            "y": 1,
            "yanchor": "top",
            "yref": "container",
            "pad": {"t": MODEBAR_PX + LINE_PX["title"] * (title_lines - 1) // 2, "l": 12},
            "font": {"size": 15},
        },
        xaxis_title={"text": x, "font": {"size": 13}},
        yaxis_title={"text": y, "font": {"size": 13}},
        template="plotly_white",
        # Transparent, with a grey that reads on a light and on a dark page: the app's theme shows through.
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font={"color": INK},
        margin={"l": 50 + LINE_PX["axis"] * y.count("<br>"), "r": 20, "t": top, "b": bottom},
        height=260 + top + bottom - 50,
        # Below the axis title, however many lines it took.
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"},
    )
    fig.update_xaxes(gridcolor=GRID, zerolinecolor=GRID)
    fig.update_yaxes(gridcolor=GRID, zerolinecolor=GRID)
    return fig


MIN_JUDGED = 5  # fewer judged tokens at a position than this, and its rate is greyed as too few


def acceptance_by_position(trace: Trace) -> go.Figure:
    rows = costmodel.acceptance_by_position(trace)
    fig = go.Figure(
        go.Bar(
            x=[j + 1 for j, _, _ in rows],
            y=[a / r if r else 0 for _, r, a in rows],
            customdata=[[a, r] for _, r, a in rows],
            text=[f"n={r}" for _, r, _ in rows],
            textposition="outside",
            hovertemplate="position %{x}: %{customdata[0]} kept of the %{customdata[1]} judged there<extra></extra>",
            marker_color=[COLORS["accepted"] if r >= MIN_JUDGED else COLORS["discarded"] for _, r, _ in rows],
            # Hatched, not solid: 1 of 1 accepted is a full bar that must not read as a measured 100%.
            marker_pattern_shape=["" if r >= MIN_JUDGED else "/" for _, r, _ in rows],
        )
    )
    fig.update_yaxes(range=[0, 1.12])
    # Only judged tokens count: a position is judged when every earlier draft token of its round
    # was kept; discarded tokens never were. The glossary's "per-position acceptance (SpecLens)":
    # α at each position, as the cost model and the benchmarks take it, not vLLM's (per_position_figure).
    return _layout(
        fig,
        "Acceptance by draft position, of the tokens judged there",
        f"draft position (judged tokens only, n of them; hatched grey: fewer than {MIN_JUDGED})",
        "kept / judged there",
        whole_x=True,
    )


def accepted_length_histogram(trace: Trace) -> go.Figure:
    # A round that drafted nothing accepted nothing by no verdict of the target: it is left out.
    drafted = [s for s in trace.rounds if s.drafted]
    counts = Counter(s.n_accepted for s in drafted)
    top = max([s.drafted for s in drafted] + [0])
    xs = list(range(top + 1))
    fig = go.Figure(go.Bar(x=xs, y=[counts.get(x, 0) for x in xs], marker_color=COLORS["bonus"]))
    left_out = len(trace.rounds) - len(drafted)
    x_title = "accepted draft tokens" + (
        f" ({left_out} round{'s' * (left_out != 1)} that drafted nothing left out)" if left_out else ""
    )
    return _layout(fig, "Accepted tokens per round", x_title, "rounds", whole_x=True)


def round_time_split(trace: Trace) -> go.Figure:
    rounds = list(range(1, len(trace.rounds) + 1))
    draft = [s.draft_ms for s in trace.rounds]
    verify = [s.verify_ms for s in trace.rounds]
    other = [max(0.0, s.round_ms - s.draft_ms - s.verify_ms) for s in trace.rounds]
    fig = go.Figure(
        [
            go.Bar(name="drafting", x=rounds, y=draft, marker_color=COLORS["draft"]),
            go.Bar(name="verifying", x=rounds, y=verify, marker_color=COLORS["verify"]),
            go.Bar(name="bookkeeping", x=rounds, y=other, marker_color=COLORS["other"]),
        ]
    )
    fig.update_layout(barmode="stack")
    return _layout(fig, "Time per round", "round", "ms")


def tokens_over_time(trace: Trace) -> go.Figure:
    times = trace.token_times_s()
    fig = go.Figure(
        go.Scatter(
            x=[0.0, *times],
            y=list(range(len(times) + 1)),
            name="speculative",
            line={"shape": "hv", "color": COLORS["accepted"]},
        )
    )
    if trace.baseline is not None and trace.baseline.token_times_s:
        bt = trace.baseline.token_times_s
        fig.add_scatter(
            x=[0.0, *bt],
            y=list(range(len(bt) + 1)),
            name="plain",
            line={"shape": "hv", "color": COLORS["plain"]},
        )
    return _layout(fig, "Tokens generated against wall-clock time", "seconds", "tokens")


def trace_figures(trace: Trace) -> list[go.Figure]:
    """The four Explore/Replay charts, in display order."""
    return [
        acceptance_by_position(trace),
        accepted_length_histogram(trace),
        round_time_split(trace),
        tokens_over_time(trace),
    ]


def _measured(table: pd.DataFrame, x: str, name: str) -> go.Scatter:
    """The median speedup of each setting, with bars from its lowest to its highest repeat."""
    return go.Scatter(
        x=table[x],
        y=table["speedup"],
        mode="lines+markers",
        name=name,
        error_y={
            "type": "data",
            "symmetric": False,
            "array": table["speedup_high"] - table["speedup"],
            "arrayminus": table["speedup"] - table["speedup_low"],
        },
    )


def _star_best(fig: go.Figure, table: pd.DataFrame, x: str, label: str) -> None:
    """Star the setting that beats the others beyond their spread; say so when none does."""
    best = table[table["best"]] if "best" in table else table.iloc[0:0]
    if best.empty:
        once = "repeats" in table and len(table) > 1 and table["repeats"].max() < 2
        why = "each setting ran once, so there is no spread to judge by" if once else "the spreads overlap"
        fig.add_annotation(text=f"no clear best: {why}", showarrow=False, x=0.5, y=1.08,
                           xref="paper", yref="paper", font={"color": INK})  # fmt: skip
        return
    row = best.iloc[0]
    fig.add_scatter(
        x=[row[x]],
        y=[row["speedup"]],
        mode="markers+text",
        text=[f"best {label}={int(row[x])}"],
        textposition="top center",
        marker={"size": 14, "symbol": "star", "color": COLORS["correction"]},
        name="best",
    )


def speedup_curve(table: pd.DataFrame) -> go.Figure:
    """Median measured speedup against k (bars: lowest to highest repeat), with the two cost-model
    predictions; the best k starred where it is clear."""
    fig = go.Figure(_measured(table, "k", "measured"))
    fig.add_scatter(
        x=table["k"],
        y=table["predicted_leviathan"],
        mode="lines",
        name="Leviathan (V = 1 step)",
        line={"dash": "dot"},
    )
    fig.add_scatter(
        x=table["k"],
        y=table["predicted_measured"],
        mode="lines",
        name="measured verify cost",
        line={"dash": "dash"},
    )
    _star_best(fig, table, "k", "k")
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    return _layout(
        fig,
        "Speedup over plain decoding against draft length",
        "k (draft length)",
        "speedup (×)",
        whole_x=True,
    )


def _categories(table: pd.DataFrame) -> pd.DataFrame:
    """The workload table to draw: with a single category, "all" repeats it line for line (and
    would hide it), so it is left out."""
    if table["category"].nunique() == 2 and "all" in set(table["category"]):
        return table[table["category"] != "all"]
    return table


def workload_curve(table: pd.DataFrame) -> go.Figure:
    """Median speedup of each category's whole workload against k, one line per category ("all"
    bold), bars from the lowest to the highest repeat; each category's clear best k starred."""
    fig = go.Figure()
    for category, part in _categories(table).groupby("category", sort=False):
        line = _measured(part, "k", str(category))
        if category == "all":
            line.line = {"width": 4, "color": COLORS["plain"]}
        fig.add_trace(line)
        best = part[part["best"]]
        if not best.empty:
            fig.add_scatter(x=best["k"], y=best["speedup"], mode="markers", showlegend=False,
                            marker={"size": 14, "symbol": "star", "color": COLORS["correction"]},
                            hovertext=f"best k for {category}")  # fmt: skip
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    fig.update_layout(showlegend=True)  # Plotly hides a lone line's legend, and so its category's name
    return _layout(fig, "Speedup per category against draft length (★ clear best)", "k (draft length)",
                   "speedup (×)", whole_x=True)  # fmt: skip


def compare_figure(table: pd.DataFrame) -> go.Figure:
    """Each draft source's median speedup over plain decoding, bars from its lowest to its highest
    repeat; the clear best starred in its name."""
    names = [
        f"★ {d}" if best else d for d, best in zip(table["draft"], table.get("best", [False] * len(table)))
    ]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=table["speedup"],
            marker_color=COLORS["accepted"],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": table["speedup_high"] - table["speedup"],
                "arrayminus": table["speedup"] - table["speedup_low"],
            },  # fmt: skip
            text=[f"×{x:.2f}" for x in table["speedup"]],
        )
    )
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    return _layout(fig, "Speedup over plain decoding by draft source", "draft source", "speedup (×)")


def compare_tokens_figure(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure(go.Bar(x=table["draft"], y=table["tokens_per_round"], marker_color=COLORS["bonus"],
                           text=[f"c = {c:.2f}" for c in table["draft_cost"]]))  # fmt: skip
    return _layout(
        fig, "Tokens per round (label: draft cost c in target steps)", "draft source", "tokens per round"
    )


def workload_tokens_per_round(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for category, part in _categories(table).groupby("category", sort=False):
        fig.add_scatter(x=part["k"], y=part["tokens_per_round"], mode="lines+markers", name=str(category))
    fig.update_layout(showlegend=True)
    return _layout(fig, "Tokens per round per category", "k (draft length)", "tokens per round", whole_x=True)


def acceptance_vs_k(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    fig.add_scatter(x=table["k"], y=table["acceptance_rate"], mode="lines+markers", name="acceptance rate")
    fig.add_scatter(
        x=table["k"], y=table["tokens_per_round"], mode="lines+markers", name="tokens per round", yaxis="y2"
    )
    fig.update_layout(
        # Both axes from 0: tokens per round from 2.3 to 2.7 must not look like acceptance 0.1 to 0.9.
        yaxis={"range": [0, 1]},
        yaxis2={"overlaying": "y", "side": "right", "title": "tokens/round", "rangemode": "tozero"},
    )
    return _layout(
        fig, "Acceptance against draft length", "k (draft length)", "acceptance rate", whole_x=True
    )


def tree_size_curve(table: pd.DataFrame) -> go.Figure:
    """Measured speedup and tokens per round against tree size (0: the chain of the same depth)."""
    fig = go.Figure(_measured(table, "nodes", "speedup (measured)"))
    _star_best(fig, table, "nodes", "N")
    fig.add_scatter(
        x=table["nodes"],
        y=table["tokens_per_round"],
        mode="lines+markers",
        name="tokens per round",
        yaxis="y2",
        line={"dash": "dot"},
    )
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    fig.update_layout(yaxis2={"overlaying": "y", "side": "right", "title": "tokens/round"})
    return _layout(fig, "Speedup against tree size", "N (tree nodes; 0 = the chain)", "speedup (×)")


def tree_verify_cost(table: pd.DataFrame) -> go.Figure:
    """What checking N drafted tokens at once costs, in plain target steps: trees pay it every round."""
    fig = go.Figure()
    fig.add_scatter(
        x=table["nodes"],
        y=table["verify_ratio"],
        mode="lines+markers",
        marker_color=COLORS["verify"],
        name="verify pass ÷ plain step",
    )
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    return _layout(
        fig, "Verify cost against tree size", "N (tree nodes; 0 = the chain)", "target steps per verify pass"
    )


def theory_figure(
    alpha: float,
    c: float,
    verify_growth: float,
    gamma_max: int = 16,
    measured: dict[int, float] | None = None,
) -> go.Figure:
    """Expected speedup and tokens per round against gamma, from the cost model alone.

    verify_growth b models the cost of checking gamma+1 tokens as
    (1 + b * gamma) target steps; b = 0 is Leviathan's assumption. `measured`
    (V(n)/V(1) at a few n, from the probe) adds the curve for this machine.
    """
    gammas = list(range(1, gamma_max + 1))
    tokens = [costmodel.expected_tokens(alpha, g) for g in gammas]
    lev = [costmodel.expected_speedup(alpha, g, c) for g in gammas]
    meas = [costmodel.expected_speedup_measured(alpha, g, 1.0, c, 1.0 + verify_growth * g) for g in gammas]
    fig = go.Figure()
    fig.add_scatter(x=gammas, y=lev, mode="lines+markers", name="speedup (V = 1 step)")
    if verify_growth:
        fig.add_scatter(
            x=gammas, y=meas, mode="lines+markers", name=f"speedup (V grows {verify_growth:.2f}/token)"
        )
    if measured:
        here = [
            costmodel.expected_speedup_measured(alpha, g, 1.0, c, costmodel.verify_ratio_at(measured, g + 1))
            for g in gammas
        ]
        fig.add_scatter(x=gammas, y=here, mode="lines+markers", name="speedup (V measured here)")
    fig.add_scatter(
        x=gammas, y=tokens, mode="lines", name="tokens per round", yaxis="y2", line={"dash": "dot"}
    )
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    fig.update_layout(yaxis2={"overlaying": "y", "side": "right", "title": "tokens/round"})
    return _layout(fig, f"Expected speedup, α={alpha:.2f}, c={c:.2f}", "γ (draft length)", "speedup (×)")


def concurrency_figure(
    speedups: dict[int, list[float]], batches: Sequence[int], measured_rows: int | None
) -> go.Figure:
    """Predicted speedup against the number of requests decoded together, one line per k, from
    costmodel.concurrency_speedups. Where B·(k+1) passes `measured_rows` (the most V(n) was measured
    for) the line goes on dashed: V(n) there is a straight-line guess."""
    fig = go.Figure()
    palette = plotly.colors.qualitative.Plotly
    guessed = False
    for i, (k, ys) in enumerate(speedups.items()):
        line = {"color": palette[i % len(palette)]}
        known = sum(1 for b in batches if measured_rows is None or b * (k + 1) <= measured_rows)
        rows = [b * (k + 1) for b in batches]
        hover = "B = %{x}: ×%{y:.2f} (%{customdata} rows a check)"
        fig.add_scatter(x=batches[:known], y=ys[:known], customdata=rows[:known], mode="lines+markers",
                        name=f"k={k}", line=line, legendgroup=str(k), hovertemplate=hover)  # fmt: skip
        if known < len(batches):
            guessed = True
            start = max(known - 1, 0)  # from the last measured point, so the line is unbroken
            fig.add_scatter(x=batches[start:], y=ys[start:], customdata=rows[start:], mode="lines+markers",
                            name=f"k={k}, a guess", showlegend=False, legendgroup=str(k),
                            line=line | {"dash": "dash"}, marker={"symbol": "circle-open"},
                            hovertemplate=hover + ", beyond those measured: a guess")  # fmt: skip
    if guessed:  # the dashes' key, in the legend
        fig.add_scatter(x=[None], y=[None], mode="lines", line={"dash": "dash", "color": INK},
                        name=f"dashed: beyond {measured_rows} rows, a guess")  # fmt: skip
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    fig.update_xaxes(type="log", tickvals=list(batches), ticktext=[str(b) for b in batches])
    source = f"V(n) measured here, 1–{measured_rows} rows" if measured_rows else "V(n) = 1 + b·(n − 1)"
    return _layout(fig, f"Predicted speedup against concurrent requests ({source})", "requests decoded together B",
                   "predicted speedup (×)")  # fmt: skip


def tree_theory_figure(
    ranks: list[float], depth: int, c: float, verify_ratio: Callable[[int], float], n_max: int = 32
) -> go.Figure:
    """Expected tokens per round and speedup of the best tree against its size N, beside the chain.

    A round drafts `depth` levels (c target steps each, whatever N) and checks
    N+1 tokens at verify_ratio(N + 1) target steps.
    """
    sizes = list(range(1, n_max + 1))
    tokens = [costmodel.expected_tokens_tree(ranks, depth, n) for n in sizes]
    speedup = [costmodel.expected_speedup_tree(ranks, depth, n, c, verify_ratio) for n in sizes]
    chain = costmodel.expected_tokens(ranks[0], depth)
    fig = go.Figure()
    fig.add_scatter(x=sizes, y=tokens, mode="lines+markers", name="tokens per round (tree)")
    fig.add_scatter(
        x=sizes,
        y=[chain] * len(sizes),
        mode="lines",
        name=f"tokens per round (chain of {depth})",
        line={"dash": "dash", "color": COLORS["plain"]},
    )
    fig.add_scatter(x=sizes, y=speedup, mode="lines", name="speedup (tree)", yaxis="y2", line={"dash": "dot"})
    fig.update_layout(yaxis2={"overlaying": "y", "side": "right", "title": "speedup (×)"})
    return _layout(
        fig,
        f"Best tree {depth} deep, candidates accepted at {', '.join(f'{a:.2f}' for a in ranks)}",
        "N (tree nodes)",
        "tokens per round",
    )


def per_position_figure(series: dict[str, list[float]]) -> go.Figure:
    """Per-position acceptance by vLLM's definition (kept at position i / drafts: every round that
    drafted, whether it reached i or not), one bar group per source. It is the chance that the first
    i tokens were all kept, so it falls with i, unlike Explore's chart of the tokens judged there."""
    fig = go.Figure()
    for (name, values), color in zip(series.items(), [COLORS["verify"], COLORS["accepted"], COLORS["draft"]]):
        fig.add_bar(
            x=list(range(1, len(values) + 1)),
            y=values,
            name=name,
            marker_color=color,
            hovertemplate="position %{x}: kept in %{y:.3f} of all drafts<extra>"
            + name.replace("<", "&lt;")
            + "</extra>",
        )
    fig.update_yaxes(range=[0, 1])
    fig.update_layout(barmode="group")
    return _layout(
        fig,
        "Per-position acceptance (vLLM's), of all drafts",
        "draft position (every draft counts, reached or not)",
        "kept there / drafts",
        whole_x=True,
    )


def best_k_figure(speedups: list[float], best: int) -> go.Figure:
    """Expected speedup against k for a measured acceptance profile, the best k starred."""
    ks = list(range(1, len(speedups) + 1))
    fig = go.Figure(go.Scatter(x=ks, y=speedups, mode="lines+markers", name="expected speedup"))
    fig.add_scatter(
        x=[best],
        y=[speedups[best - 1]],
        mode="markers+text",
        text=[f"best k={best}"],
        textposition="top center",
        marker={"size": 14, "symbol": "star", "color": COLORS["correction"]},
        name="best",
        cliponaxis=False,  # at the first or last k the label reaches past the plot's edge
    )
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    # Room above the highest point for its label, which Plotly's own range leaves out.
    low, high = min(*speedups, 1.0), max(*speedups, 1.0)
    room = (high - low) or high
    fig.update_yaxes(range=[low - 0.1 * room, high + 0.3 * room])
    fig.update_xaxes(range=[0.5, len(speedups) + 0.5])
    return _layout(
        fig,
        "Expected speedup for this acceptance profile",
        "k (num_speculative_tokens)",
        "speedup (×)",
        whole_x=True,
    )


def note_figure(title: str, text: str) -> go.Figure:
    """An empty chart that says why it has nothing to draw (a sweep stopped before a setting had
    finished), where a chart of measurements would stand."""
    fig = go.Figure()
    fig.add_annotation(text=wrap(text, TITLE_CHARS + 10), showarrow=False, x=0.5, y=0.5,
                       xref="paper", yref="paper", font={"size": 13})  # fmt: skip
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, "", "")


def batch_figure(table: pd.DataFrame) -> go.Figure:
    """Measured speedup against the batch size, one line per k (bars: lowest to highest repeat),
    beside the cost model's prediction from the same runs (dashed); where each k stops paying
    (its first batch size measured below ×1) is marked."""
    fig = go.Figure()
    palette = plotly.colors.qualitative.Plotly
    for i, (k, rows) in enumerate(table.sort_values("batch").groupby("k")):
        color = palette[i % len(palette)]
        measured = _measured(rows, "batch", f"k={k} measured")
        measured.update(line={"color": color}, legendgroup=str(k))
        fig.add_trace(measured)
        fig.add_scatter(x=rows["batch"], y=rows["predicted_speedup"], mode="lines", name=f"k={k} predicted",
                        line={"color": color, "dash": "dash"}, legendgroup=str(k))  # fmt: skip
        # Where it falls below ×1 and stays there: a dip that comes back is not where it stops paying.
        paying = rows["speedup"] >= 1.0
        after = len(paying) - paying[::-1].values.argmax() if paying.any() else 0
        if after < len(rows):
            first = rows.iloc[after]
            fig.add_scatter(x=[first["batch"]], y=[first["speedup"]], mode="markers+text", showlegend=False,
                            text=[f"k={k}: off from here"], textposition="top right", legendgroup=str(k),
                            marker={"size": 13, "symbol": "x", "color": color})  # fmt: skip
    fig.add_hline(y=1.0, line={"color": "#999", "width": 1})
    batches = sorted(table["batch"].unique())
    fig.update_xaxes(type="log", tickvals=batches, ticktext=[str(b) for b in batches])
    return _layout(fig, "Speedup against requests decoded together, measured here", "batch size B",
                   "speedup over plain decoding (×)")  # fmt: skip


def add_measured_batches(fig: go.Figure, rows: list[dict]) -> go.Figure:
    """Speedups measured with many requests at once (the Traffic tab's rows: batch, k, speedup), as
    markers on a concurrency chart, one colour a k as the chart's lines."""
    palette = plotly.colors.qualitative.Plotly
    table = pd.DataFrame(rows)
    for k, part in table.sort_values("batch").groupby("k"):
        fig.add_scatter(x=part["batch"], y=part["speedup"], mode="markers", name=f"k={k} measured",
                        marker={"symbol": "diamond", "size": 11, "color": palette[(int(k) - 1) % len(palette)],
                                "line": {"width": 1, "color": INK}},
                        hovertemplate="B = %{x}: ×%{y:.2f} measured")  # fmt: skip
    return fig
