"""The Theory tab says what it shows: the concurrency sentence reads the chart's own figures, the
rows V(n) was measured for are marked and what lies beyond is drawn as a guess, and once V(n) is
measured the b slider still moves every view it feeds."""

from __future__ import annotations

import re

import pytest

from app.tabs import theory
from app.ui import build_demo
from decoding import costmodel

# A V(n) timed up to 64 rows whose 32 came out dear: k = 1 dips below 1 at B = 16 and comes back.
DIPPING = {1: 1.0, 2: 1.0, 3: 1.05, 5: 1.1, 9: 1.3, 17: 1.6, 32: 4.0, 64: 6.0}
# This machine's kind of curve: flat while the weights stream, then growing with the rows.
MEASURED = {1: 1.0, 2: 1.02, 3: 1.03, 5: 1.07, 9: 1.2, 17: 1.9, 32: 3.4, 64: 6.6}


def lines(fig) -> dict[int, dict[int, float]]:
    """Each k's speedup at each B, as drawn (solid and dashed parts together)."""
    found: dict[int, dict[int, float]] = {}
    for line in fig.data:
        if line.name and line.name.startswith("k="):
            k = int(line.name.split("=")[1].split(",")[0])
            found.setdefault(k, {}).update(zip(line.x, line.y, strict=True))
    return found


@pytest.mark.parametrize("measured", [DIPPING, MEASURED, None])
def test_the_concurrency_sentence_says_what_its_chart_draws(measured):
    fig, text = theory.run_concurrency(0.7, 0.1, 0.3, measured)
    drawn = lines(fig)
    assert set(drawn) == set(range(1, 7))
    for k, at in drawn.items():
        below = [b for b in costmodel.CONCURRENCY if at[b] < 1.0]
        if not below:
            assert f"k = {k} " not in text.split("Predicted")[1].split("Up to")[0] or "every k" in text
        elif below == list(costmodel.CONCURRENCY):
            assert "it does not pay even alone" in text and str(k) in text.split("At k = ")[1].split(" it")[0]
        elif all(at[b] < 1.0 for b in costmodel.CONCURRENCY if b >= below[0]):
            assert f"k = {k} at B = {below[0]}" in text, (k, at, text)
        else:  # below 1 somewhere, above it again later: never "stops paying"
            assert f"k = {k} at B = " not in text and f"k = {k} is below 1 at B = {below[0]}" in text, text


def test_the_busy_dip_is_said_as_drawn():
    """The text said "stops paying at k = 1 at B = 16" while the chart went back above 1 at B = 32."""
    fig, text = theory.run_concurrency(0.7, 0.1, 0.0, DIPPING)
    at = lines(fig)[1]
    assert at[16] < 1.0 < at[32]
    assert "stops paying at k = 1 at B = 16" not in text
    assert "k = 1 is below 1 at B = 16, 64 (a guess) and above it again at B = 32." in text


def test_the_rows_measured_are_marked_and_beyond_them_is_drawn_as_a_guess():
    fig, text = theory.run_concurrency(0.9, 0.02, 0.0, MEASURED)
    assert "1–64 rows" in fig.layout.title.text.replace("<br>", " ")
    for line in fig.data:
        if not (line.name or "").startswith("k="):
            continue
        k = int(line.name.split("=")[1].split(",")[0])
        rows = [b * (k + 1) for b in line.x]
        if line.line.dash == "dash":  # the guess: from the last measured point on
            assert line.name.endswith("a guess") and rows[0] <= 64 < rows[-1] and line.showlegend is False
            assert all(r > 64 for r in rows[1:])
        else:
            assert all(r <= 64 for r in rows), line.name
    assert any(line.name == "dashed: beyond 64 rows, a guess" for line in fig.data)
    assert "measured for 1–64 rows" in text and "straight-line guess" in text
    assert "k = 3 at B = 16, k = 4 at B = 16 (a guess)" in text  # 64 rows measured, 80 guessed
    for k, b, guess in re.findall(r"k = (\d) at B = (\d+)( \(a guess\))?", text):  # a verdict past 64 rows
        assert bool(guess) == (int(b) * (int(k) + 1) > 64), text
    _, free = theory.run_concurrency(0.7, 0.1, 0.2)  # b's line is a model, not a measurement: no guess
    assert "guess" not in free


def test_moving_b_moves_every_view_it_feeds_once_v_is_measured():
    """Measured, every view used this machine's V(n) and b moved one curve only. Moving b now
    chooses b's line for every view; the choice above the charts goes back to the measured one."""
    measured, choice = theory.slider_moved(MEASURED)
    assert measured == {} and choice["value"] == theory.SLIDER
    views = (
        lambda b, m: theory.run_theory(0.7, 0.1, b, 12, m)[1],
        lambda b, m: theory.run_concurrency(0.7, 0.1, b, m)[1],
        lambda b, m: theory.run_tree_theory(0.7, 0.15, 3, 4, 0.1, b, m)[1],
    )
    for view in views:
        assert view(0.1, measured) != view(0.6, measured)  # b's line: b moves it
        assert view(0.1, MEASURED) == view(0.6, MEASURED)  # the measured V(n): b has no say
    assert theory.pick_source(theory.MEASURED, MEASURED) == MEASURED
    assert theory.pick_source(theory.SLIDER, MEASURED) == {}
    assert theory.slider_moved(None)[0] is None  # nothing measured: b's line already
    # Chosen, not missing: the text says b was chosen, not that nothing was measured.
    _, text = theory.run_concurrency(0.7, 0.1, 0.2, measured)
    assert "not measured on this machine" not in text and "This follows b, as chosen above" in text
    assert "not measured on this machine yet" in theory.run_concurrency(0.7, 0.1, 0.2, None)[1]


def test_the_page_reruns_every_view_after_b_chooses_its_line():
    """Wired: b's input first chooses b's line, then every view reruns; no view runs on b's change
    straight away, where it could finish on the V(n) from before the choice."""
    config = build_demo().config
    deps = {d["id"]: d for d in config["dependencies"]}
    named = {d["api_name"]: d for d in deps.values()}
    views = [named[name] for name in ("theory", "concurrency", "tree_theory")]
    b, measured = named["theory"]["inputs"][2], named["theory"]["inputs"][4]
    assert all(named[n]["inputs"][-1] == measured for n in ("theory", "concurrency", "tree_theory"))
    for view in views:
        assert [b, "change"] not in [list(t) for t in view["targets"]], view["api_name"]
    moved = [d for d in deps.values() if [b, "input"] in [list(t) for t in d["targets"]]]
    assert len(moved) == 1 and measured in moved[0]["outputs"]
    after = {tuple(d["outputs"]) for d in deps.values() if d["trigger_after"] == moved[0]["id"]}
    assert all(tuple(view["outputs"]) in after for view in views)
