"""A real browser (Debian's Chromium, driven by Playwright) against the live app.

Screenshots land in artifacts/ (or $SPECLENS_ARTIFACTS) as test artefacts.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import ROOT
from playwright.sync_api import sync_playwright
from test_metrics import FakeVLLM, reply, serve

from app import common
from app.examples import OUTCOMES, classroom_examples
from decoding.costmodel import price_on_gpu
from decoding.models import load_model
from decoding.tools.gpu_figures import recorded
from decoding.tools.probe import cached, measure
from decoding.trace import DraftToken, Emitted, Output, Round, RunMeta, Trace, Verdict, validate
from visualize import glossary
from visualize.busy import BUSY
from visualize.race import plain_tokens, spec_tokens
from visualize.timeline import KIND_COLOURS, KIND_LABELS

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(os.environ.get("SPECLENS_ARTIFACTS", ROOT / "artifacts"))
LONG = 180_000  # ms: a run on two CPU cores, with a plain run to compare


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing: `make browser` installs Debian's chromium")
        pytest.skip("Chromium is not installed (make browser)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, live_app):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.goto(live_app, wait_until="load")
    page.wait_for_selector("#run", timeout=60_000)
    # The page opens on an example run: a test's own run starts from there.
    page.wait_for_function(
        "document.querySelector('#run-status').innerText.includes('Example')", timeout=60_000
    )
    yield page
    context.close()


def run(page) -> None:
    """Press Run; returns once the page has let go of the example run (its status and cards clear)."""
    page.click("#run")
    page.wait_for_function(
        "!document.querySelector('#run-status').innerText.includes('Example')"
        " && !document.querySelector('#cards').innerText.includes('speedup')",
        timeout=30_000,
    )


def set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def test_explore_run_timeline_charts_and_download(page):
    page.locator("#pair input").click()  # n-gram: a draft whose cost a GPU's figures can price
    page.get_by_role("option", name="SmolLM2-135M · n-gram draft (offline)").click()
    page.fill("#prompt textarea", "Repeat exactly: red, green, blue. red, green, blue. red, green, blue.")
    set_number(page, "max-new", 24)
    run(page)
    page.wait_for_selector("#cards .sl-card", timeout=LONG)
    page.wait_for_function("document.querySelector('#cards').innerText.includes('identical')", timeout=LONG)
    page.wait_for_selector("#trace-json a", timeout=30_000)
    with page.expect_download() as info:
        page.locator("#trace-json a").first.click()
    path = ARTIFACTS / "browser-trace.json"
    info.value.save_as(path)
    trace = Trace.load(path)
    validate(trace)
    assert trace.meta.draft == "ngram"

    # "On a GPU": this run's acceptance priced on the recorded card, beside its own measured speedup.
    (h200,) = recorded()
    priced = price_on_gpu(trace, h200)
    page.locator("#on-gpu").get_by_text("On a GPU").click()
    page.wait_for_function(
        # The section's body renders once it is opened: null until then.
        "s => document.querySelector('#on-gpu-table')?.innerText.includes(s)",
        arg=f"×{trace.totals.speedup:.2f}",
        timeout=30_000,
    )
    section = page.locator("#on-gpu-table")
    assert section.is_visible()
    said = section.inner_text()
    assert f"Predicted on the {h200.card}" in said and "A prediction, not a measurement" in said, said
    assert section.locator("tbody tr").count() == len(priced.prices) > 0
    assert all(f"×{p.speedup:.2f}" in said for p in priced.prices), said

    kinds = {"accepted"} if any(s.n_accepted for s in trace.rounds) else set()
    kinds |= {"rejected"} if any(s.n_accepted < s.drafted for s in trace.rounds) else set()
    kinds |= {s.emitted.kind for s in trace.rounds if s.emitted}
    for kind in kinds | {"prompt"}:
        chip = page.locator(f"#timeline .sl-rounds .sl-tok.sl-{kind}").first
        assert chip.is_visible(), kind
        colour = chip.evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)"), (kind, colour)
    assert page.locator("#timeline [data-round]").count() == len(trace.rounds)
    if "rejected" in kinds:
        struck = page.locator("#timeline .sl-rounds .sl-tok.sl-rejected").first
        assert "line-through" in struck.evaluate("e => getComputedStyle(e).textDecorationLine")

    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
    assert page.locator(".js-plotly-plot").count() >= 4

    first_round = page.locator("#timeline [data-round='0']")
    first_round.hover()
    assert first_round.locator(".sl-explain").is_visible()
    assert first_round.locator(".sl-explain").inner_text().startswith("Round 1:")
    page.screenshot(path=ARTIFACTS / "explore.png", full_page=True)


def test_sweep_three_points(page):
    page.get_by_role("tab", name="Sweep").click()
    set_number(page, "k-to", 3)
    page.click("#sweep")
    page.wait_for_function("/best k/i.test(document.querySelector('#sweep-summary').innerText)", timeout=LONG)
    page.wait_for_selector("#speedup-plot .js-plotly-plot .main-svg", timeout=30_000)
    page.screenshot(path=ARTIFACTS / "sweep.png", full_page=True)


def test_sweep_k_over_a_workload(page):
    page.get_by_role("tab", name="Sweep").click()
    page.get_by_role("radio", name="k over a workload").check()
    page.locator("#workload input").click()
    page.get_by_role("option", name="Spec-Bench dev: translation").click()
    set_number(page, "k-to", 2)
    set_number(page, "repeats", 1)
    page.click("#sweep")
    page.wait_for_function(
        "document.querySelector('#sweep-summary').innerText.includes('translation')", timeout=LONG
    )
    summary = page.locator("#sweep-summary").inner_text()
    assert "2 prompts × 2 k × 1 repeat " in summary and "all:" not in summary  # "all" would repeat it
    text = page.evaluate("document.querySelector('#sweep-table').textContent")
    assert re.findall(r"\b(translation|all)\s+\d", text) == ["translation", "translation"], text
    page.wait_for_selector("#speedup-plot .js-plotly-plot .main-svg", timeout=30_000)
    legend = page.locator("#speedup-plot .legendtext").evaluate_all("els => els.map(e => e.textContent)")
    assert legend == ["translation"]  # one category: "all" would only repeat it
    page.screenshot(path=ARTIFACTS / "sweep-workload.png", full_page=True)


def test_sweep_compares_three_draft_sources_and_races_them(page):
    page.get_by_role("tab", name="Sweep").click()
    page.get_by_role("radio", name="draft sources").check()
    set_number(page, "repeats", 1)
    page.click("#sweep")
    page.wait_for_function(
        "/best source|Fastest/.test(document.querySelector('#sweep-summary').innerText)", timeout=LONG
    )
    page.wait_for_function(
        "document.querySelector('#sweep-table').textContent.includes('ngram+head')", timeout=30_000
    )
    text = page.evaluate("document.querySelector('#sweep-table').textContent")
    rows = re.findall(r"\s(ngram\+head|ngram|head)\s+\d", text)  # a row: its source, then its figures
    assert rows == ["ngram", "head", "ngram+head"], text
    lanes = page.locator("#sweep-race .sl-lane").evaluate_all("els => els.map(e => e.dataset.lane)")
    assert lanes == [lane for d in ("ngram", "head", "ngram+head") for lane in (d, f"plain, before {d}")]
    page.click("#sweep-race .sl-race-play")
    page.wait_for_function(
        "document.querySelector('#sweep-race .sl-race').dataset.done === '1'", timeout=30_000
    )
    counts = page.locator("#sweep-race .sl-lane-count").all_inner_texts()
    assert len(set(counts)) == 1 and int(counts[0]) > 0  # every lane wrote every token in the end
    page.screenshot(path=ARTIFACTS / "sweep-sources.png", full_page=True)


def test_a_sweep_its_budget_ends_says_so_in_its_charts_and_summary(page, monkeypatch):
    """Ended by its time budget before any prompt finished, the default workload sweep shows no
    "Error" and no stuck "Sweeping…": its charts and summary say what stopped it."""
    monkeypatch.setattr(common, "TIME_LIMIT_S", 0.0)
    page.get_by_role("tab", name="Sweep").click()
    page.get_by_role("radio", name="k over a workload").check()
    page.click("#sweep")
    page.wait_for_function(
        "document.querySelector('#sweep-summary').innerText.includes('Nothing measured')", timeout=LONG
    )
    summary = page.locator("#sweep-summary").inner_text()
    assert "0 s time limit" in summary and "Sweeping" not in summary, summary
    page.wait_for_selector("#speedup-plot .js-plotly-plot .main-svg", timeout=30_000)
    assert "Nothing measured" in page.locator("#speedup-plot").inner_text()
    page.wait_for_function("!document.querySelector('#sweep').disabled", timeout=30_000)
    assert page.evaluate(ERROR_BADGES) == 0
    page.screenshot(path=ARTIFACTS / "sweep-stopped.png", full_page=True)


def test_a_new_sweep_clears_what_the_last_one_showed(page):
    """A sweep over k after a race of sources: while it runs, no summary, chart or race of the
    sources is left on the screen to be read as its own."""
    page.get_by_role("tab", name="Sweep").click()
    page.get_by_role("radio", name="draft sources").check()
    set_number(page, "repeats", 1)
    set_number(page, "max-new", 8)
    page.click("#sweep")
    page.wait_for_function(
        "/best source|Fastest/.test(document.querySelector('#sweep-summary').innerText)", timeout=LONG
    )
    page.wait_for_selector("#sweep-race .sl-lane", timeout=30_000)
    page.get_by_role("radio", name="draft length k").check()
    set_number(page, "k-to", 2)
    page.click("#sweep")
    page.wait_for_function(
        """() => document.querySelector('#sweep').disabled
            && !/source|Fastest/.test(document.querySelector('#sweep-summary').innerText)
            && !document.querySelector('#sweep-race .sl-lane')
            && !document.querySelector('#speedup-plot .js-plotly-plot')
            && !document.querySelector('#sweep-table').textContent.includes('ngram')""",
        timeout=30_000,
    )
    page.wait_for_function("/best k/i.test(document.querySelector('#sweep-summary').innerText)", timeout=LONG)


def test_traffic_measures_batches_and_gives_each_engine_its_k_by_batch_size(page):
    """Batch sizes 1 and 2 at k = 2 on one prompt per category: the measured points and the
    prediction drawn, the sentence saying why, and vLLM's and SGLang's settings from the same rows."""
    page.get_by_role("tab", name="Traffic").click()
    for box in page.locator("#batch-sizes input[type=checkbox]").all():
        if box.is_checked() != (box.evaluate("b => b.parentElement.innerText.trim()") in ("1", "2")):
            box.click()
    for box in page.locator("#batch-ks input[type=checkbox]").all():
        if box.is_checked() != (box.evaluate("b => b.parentElement.innerText.trim()") == "2"):
            box.click()
    set_number(page, "batch-per-category", 1)
    set_number(page, "batch-tokens", 8)
    page.locator("#traffic-run").click()
    # The tab may open on a measurement kept from before: this run's words come after "Measuring…".
    page.wait_for_function(
        "document.querySelector('#traffic-why').innerText.includes('Measuring')", timeout=60_000
    )
    page.wait_for_function(
        "/target pass costs|even 2 rows cost/.test(document.querySelector('#traffic-why').innerText)",
        timeout=LONG,
    )
    why = page.locator("#traffic-why").inner_text()
    assert "1 request" in why and "2 requests together" in why
    legend = page.locator("#traffic-plot .legendtext").evaluate_all("els => els.map(e => e.textContent)")
    assert "k=2 measured" in legend and "k=2 predicted" in legend
    headers = page.locator("#traffic-table thead").inner_text()
    assert "batch size B" in headers and "predicted (batched)" in headers
    # Whether speculation paid is measured, not given: each engine's setting must follow the table.
    vllm, sglang = (page.locator(f"#traffic-{e}").inner_text() for e in ("vllm", "sglang"))
    speedups = _column(page, "#traffic-table", "speedup vs plain")
    assert len(speedups) == 2  # B = 1 and 2 at k = 2
    if any(s > 1.0 for s in speedups):
        assert "num_speculative_tokens_per_batch_size" in vllm and "candidate_steps" in sglang
    else:
        assert "paid at no batch size measured (1, 2): leave it off" in vllm and "leave it off" in sglang
    page.screenshot(path=ARTIFACTS / "traffic.png", full_page=True)


def _column(page, table: str, header: str) -> list[float]:
    """The numbers of a rendered table's column, found by its header's text (by ARIA role: Gradio
    also renders a hidden copy of the rows to size the columns)."""
    cells = page.locator(table).evaluate(
        """(root, header) => {
            const names = [...root.querySelectorAll("[role=columnheader]")].map(th => th.textContent);
            const at = names.findIndex(name => name.includes(header));
            const cells = root.querySelectorAll(`[role=gridcell][data-col="${at}"]`);
            return at < 0 ? [] : [...cells].map(cell => cell.textContent);
        }""",
        header,
    )
    assert cells, f"no '{header}' column in {table}"
    return [float(re.search(r"-?\d+(?:\.\d+)?", cell).group()) for cell in cells]


def test_traffic_refuses_no_batch_size_in_one_message_and_stays_usable(page):
    page.get_by_role("tab", name="Traffic").click()
    page.wait_for_function("document.querySelector('#traffic-why').innerText.trim() !== ''", timeout=30_000)
    before = page.locator("#traffic-why").inner_text()  # what the tab opened on, kept or not
    for box in page.locator("#batch-sizes input[type=checkbox]").all():
        if box.is_checked():
            box.click()
    page.locator("#traffic-run").click()
    page.get_by_text("tick at least one batch size").first.wait_for(timeout=30_000)
    page.wait_for_function("!document.querySelector('#traffic-run').disabled", timeout=30_000)
    assert (
        page.locator("#traffic-why").inner_text() == before
    )  # a refused input leaves the views as they were


def test_explore_steps_through_each_round_stage_by_stage(page):
    """The example run, built up one stage at a time: the draft's guesses; the target reading them
    all in one pass, its measured time beside the k + 1 plain steps writing them one at a time
    would take; every verdict at once; the target's own token, and only then the round's sentence.
    Next and previous move one stage, the arrow keys too, and "show all" gives back every round."""
    example = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    timeline = page.locator("#timeline")
    page.wait_for_selector("#timeline .sl-stepper", timeout=60_000)
    rounds = timeline.locator(".sl-round").count()
    first_round = timeline.locator(".sl-round").first
    drafts = first_round.locator("[data-step='draft']").count()
    assert drafts == example.rounds[0].drafted > 1
    where = timeline.locator(".sl-step-where")

    def state() -> tuple[str, int, int]:
        visible = timeline.locator(".sl-round:not(.sl-future)").count()
        return where.inner_text(), visible, timeline.locator(".sl-pending").count()

    def told() -> bool:  # the round's sentence, in its row and in the view below the timeline
        held = page.locator("#sentence").get_attribute("data-sl-held") is not None
        return first_round.locator(".sl-explain").is_visible() and not held

    def own_token_shown() -> bool:
        emit = first_round.locator("[data-step='emit']")
        return emit.evaluate("e => getComputedStyle(e).visibility") == "visible"

    timeline.locator(".sl-step-next").click()
    first = state()
    assert first[0].startswith(f"Round 1 of {rounds}: the draft proposes {drafts} tokens") and first[1] == 1
    assert first[2] == drafts  # the draft's tokens shown, none judged yet
    assert not told() and not own_token_shown() and not first_round.locator(".sl-pass").is_visible()
    timeline.locator(".sl-step-next").click()  # the check: one pass over every guess
    check = state()
    plain_ms = (example.baseline.token_times_s[-1] - example.baseline.token_times_s[0]) * 1e3
    plain_ms /= len(example.baseline.token_times_s) - 1
    assert check[0] == (
        f"Round 1 of {rounds}: the target reads all {drafts} guesses in one pass: "
        f"{example.rounds[0].verify_ms:.0f} ms. One at a time, those {drafts} tokens and the target's next "
        f"would take {drafts + 1} plain steps: {drafts + 1} × {plain_ms:.1f} ms = "
        f"{(drafts + 1) * round(plain_ms, 1):.0f} ms (the plain run's measured step)."
    )
    assert check[2] == drafts  # read together, none judged yet
    one_pass = first_round.locator(".sl-pass")
    assert one_pass.is_visible() and one_pass.locator(".sl-pass-one .sl-pass-seg").count() == 1
    assert one_pass.locator(".sl-pass-steps .sl-pass-seg").count() == drafts + 1
    assert not told() and not own_token_shown()
    timeline.locator(".sl-step-next").click()  # every verdict of that pass at once
    verdicts = state()
    assert verdicts[0].startswith(f"Round 1 of {rounds}: all {drafts} verdicts at once, from that one pass:")
    assert verdicts[2] == 0 and not told() and not own_token_shown()
    timeline.locator(".sl-step-next").click()  # the target's own token, and the sentence with it
    assert own_token_shown() and told()
    page.screenshot(path=ARTIFACTS / "explore-step-through.png", full_page=True)
    timeline.locator(".sl-step-prev").click()
    assert state() == verdicts and not told()
    timeline.locator(".sl-step-next").press("ArrowLeft")
    assert state() == check
    timeline.locator(".sl-step-all").click()
    assert timeline.locator(".sl-round:not(.sl-future)").count() == rounds and state()[2] == 0
    assert not one_pass.is_visible() and page.locator("#sentence").get_attribute("data-sl-held") is None


def stepper_at(page) -> str:
    return page.locator("#timeline .sl-step-where").inner_text()


def test_step_through_and_explain_round_share_one_round_and_the_keys_need_no_click(page):
    """→ works with nothing focused; stepping into round 4 explains round 4 (the slider, the
    sentence, the selected row) and the step-through goes on in the timeline the server sent
    back; the slider moved by hand steps there; a text box keeps its arrows."""
    page.wait_for_selector("#timeline .sl-stepper", timeout=60_000)
    page.keyboard.press("ArrowRight")  # nothing clicked: the page itself has the focus
    assert stepper_at(page).startswith("Round 1 of")
    for _ in range(40):
        if stepper_at(page).startswith("Round 4 of"):
            break
        page.keyboard.press("ArrowRight")
    assert stepper_at(page).startswith("Round 4 of")
    page.wait_for_function(  # the sentence came, held back until the round's last stage
        "document.querySelector('#sentence').textContent.trim().startsWith('Round 4:')"
        " && document.querySelector('#timeline .sl-selected[data-round=\"3\"]')",
        timeout=30_000,
    )
    assert page.locator("#sentence").get_attribute("data-sl-held") == ""
    assert page.locator("#round input[type=number]").input_value() == "4"
    where = stepper_at(page)
    assert where.startswith("Round 4 of")  # the timeline came back and the step-through kept its place
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowRight")
    assert stepper_at(page) == where
    set_number(page, "round", 2)
    page.wait_for_function(
        "document.querySelector('#sentence').textContent.trim().startsWith('Round 2:')"
        " && document.querySelector('#timeline .sl-step-where').innerText.startsWith('Round 2 of')",
        timeout=30_000,
    )
    page.click("#prompt textarea")
    before = stepper_at(page)
    page.keyboard.press("ArrowRight")
    assert stepper_at(page) == before  # the text box moved its caret, not the step-through
    page.screenshot(path=ARTIFACTS / "explore-step-explain.png", full_page=True)


def test_a_draft_copied_from_the_chat_template_opens_it_at_the_positions_it_names(page):
    """The example's first round copied "You are a helpful" from the folded template: a click on
    its token unfolds the template, numbered, with those positions marked and in view."""
    chip = page.locator("#timeline [data-round='0'] .sl-tok[data-copy]").first
    chip.wait_for(timeout=60_000)
    tip = chip.get_attribute("data-tip")
    first, last = map(int, re.search(r"copied from prompt tokens (\d+)–(\d+)", tip).groups())
    fold = page.locator("#timeline .sl-template").first
    assert fold.get_attribute("open") is None and "chat template" in tip
    chip.click()
    assert fold.get_attribute("open") is not None
    marked = fold.locator(".sl-match-copy")
    assert marked.evaluate_all("els => els.map(e => Number(e.dataset.pos))") == list(range(first, last + 1))
    assert marked.first.is_visible()
    number = marked.first.evaluate("e => getComputedStyle(e, '::before').content")
    assert number == f'"{first}"'  # each unfolded token shows its position
    assert "".join(marked.all_inner_texts()).replace(str(first), "", 1).strip().startswith("You")
    page.locator("#timeline").screenshot(path=ARTIFACTS / "explore-template-copy.png")


def test_replay_example_and_step_through(page):
    page.get_by_role("tab", name="Replay").click()
    example = sorted((ROOT / "assets" / "traces").glob("*.json"))[0]
    page.click("#example input")
    page.get_by_role("option", name=example.stem).click()
    page.click("#load")
    start = Trace.load(example).meta.prompt[:30]  # the chosen example, not the one the tab opened on
    page.wait_for_function(
        "([s]) => document.querySelector('#replay-timeline').innerText.includes(s)"
        " && document.querySelector('#replay-sentence').innerText.startsWith('Round 1:')",
        arg=[start],
        timeout=60_000,
    )
    for n in (2, 3):  # one step at a time, as a reader clicks
        page.click("#next")
        page.wait_for_function(
            f"document.querySelector('#replay-sentence').innerText.startsWith('Round {n}:')", timeout=30_000
        )
    assert page.locator("#replay-timeline .sl-round:visible").count() == 3  # the trace up to round 3
    assert page.locator("#replay-timeline .sl-selected[data-round='2']").count() == 1
    page.click("#prev")
    page.wait_for_function(
        "document.querySelector('#replay-sentence').innerText.startsWith('Round 2:')", timeout=30_000
    )
    page.screenshot(path=ARTIFACTS / "replay.png", full_page=True)


def test_replay_counts_every_one_of_forty_quick_clicks(page):
    page.get_by_role("tab", name="Replay").click()
    page.click("#example input")
    page.get_by_role("option", name="classroom-ngram-sampled").click()  # 45 rounds
    page.click("#load")
    page.wait_for_function(
        "document.querySelector('#replay-round input[type=range]').max === '45'"
        " && document.querySelector('#replay-sentence').innerText.startsWith('Round 1:')",
        timeout=60_000,
    )
    for _ in range(40):
        page.click("#next", delay=0)
    page.wait_for_function(
        "document.querySelector('#replay-sentence').innerText.startsWith('Round 41:')", timeout=60_000
    )
    assert page.locator("#replay-round input[type=number]").input_value() == "41"
    for _ in range(10):  # past the last round it stays there
        page.click("#next", delay=0)
    page.wait_for_function(
        "document.querySelector('#replay-sentence').innerText.startsWith('Round 45:')", timeout=60_000
    )
    page.wait_for_timeout(1000)
    assert page.locator("#replay-round input[type=number]").input_value() == "45"


def test_a_refused_upload_leaves_the_trace_on_screen_and_a_good_load_clears_the_refusal(page, tmp_path):
    """A .txt is refused as it arrives and again at Load, naming the file: the trace on screen stays
    (not the example behind the upload), and the next good load takes the refusal off the screen."""
    page.get_by_role("tab", name="Replay").click()
    page.wait_for_function(
        "document.querySelector('#replay-sentence').innerText.startsWith('Round 1:')", timeout=60_000
    )
    chosen = page.locator("#example input").input_value()
    good = next(p for p in sorted((ROOT / "assets" / "traces").glob("*.json")) if p.stem != chosen)
    shows_good = "([s]) => document.querySelector('#replay-timeline').innerText.includes(s)"
    start = Trace.load(good).meta.prompt[:30]
    page.set_input_files("#upload input[type=file]", str(good))
    page.wait_for_selector("#upload a", timeout=30_000)
    page.click("#load")
    page.wait_for_function(shows_good, arg=[start], timeout=60_000)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not a trace\n")
    page.click("#upload button[aria-label='Clear']")
    page.set_input_files("#upload input[type=file]", str(notes))
    toasts = "[...document.querySelectorAll('.toast-body.error')]"
    said = f"{toasts}.some(t => t.innerText.includes('notes.txt: not a SpecLens trace'))"
    page.wait_for_function(said, timeout=30_000)
    page.evaluate("() => document.querySelectorAll('.toast-close').forEach(b => b.click())")
    page.wait_for_function(f"{toasts}.length === 0", timeout=30_000)
    page.click("#load")
    page.wait_for_function(said, timeout=30_000)  # refused again, not swapped for the example
    page.wait_for_function("!document.querySelector('#load').disabled", timeout=30_000)
    page.wait_for_timeout(1000)
    assert page.evaluate(shows_good, [start])
    assert page.evaluate(ERROR_BADGES) == 0
    page.click("#upload button[aria-label='Clear']")
    page.set_input_files("#upload input[type=file]", str(good))
    page.wait_for_selector("#upload a", timeout=30_000)
    page.click("#load")
    # Cleared once the server has checked the file: on a loaded machine that round trip takes seconds.
    page.wait_for_function(f"{toasts}.length === 0", timeout=30_000)
    assert page.evaluate(shows_good, [start])


def replay_at(page) -> str:
    return page.locator("#replay-timeline .sl-step-where").inner_text()


def test_replays_step_through_slider_and_buttons_cover_the_whole_trace(page):
    """The 27-round example in Replay: the step-through counts every round, ▶| goes on past round 1
    and takes the Round slider along, next ▶ and a drag of the slider move the step-through with
    them, and it reaches the last round."""
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")  # the tab opens on it
    n = len(trace.rounds)
    page.get_by_role("tab", name="Replay").click()
    page.wait_for_function(
        f"document.querySelector('#replay-round input[type=range]').max === '{n}'"
        " && document.querySelector('#replay-sentence').innerText.startsWith('Round 1:')",
        timeout=60_000,
    )
    timeline, number = page.locator("#replay-timeline"), page.locator("#replay-round input[type=number]")
    stages = 4 if trace.rounds[0].drafted else 1  # draft, check, verdicts, the target's own token
    for _ in range(stages):
        timeline.locator(".sl-step-next").click()
        assert replay_at(page).startswith(f"Round 1 of {n}:")
    timeline.locator(".sl-step-next").click()
    assert replay_at(page).startswith(f"Round 2 of {n}:")
    page.wait_for_function(
        "document.querySelector('#replay-sentence').textContent.trim().startsWith('Round 2:')", timeout=30_000
    )
    assert number.input_value() == "2"
    for _ in range(2):
        page.click("#next")
    page.wait_for_function(
        f"document.querySelector('#replay-timeline .sl-step-where').innerText.startsWith('Round 4 of {n}:')",
        timeout=30_000,
    )
    assert number.input_value() == "4"
    track = page.locator("#replay-round input[type=range]")
    box = track.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 3 / (n - 1), y)  # the thumb, at round 4
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] + 20, y, steps=8)
    page.mouse.up()
    page.wait_for_function(
        f"document.querySelector('#replay-timeline .sl-step-where').innerText.startsWith('Round {n} of {n}:')"
        f" && document.querySelector('#replay-sentence').textContent.trim().startsWith('Round {n}:')",
        timeout=30_000,
    )
    assert number.input_value() == str(n)
    assert timeline.locator(".sl-round:visible").count() == n
    page.screenshot(path=ARTIFACTS / "replay-step-through.png", full_page=True)


def test_the_classroom_examples_say_what_each_shows(page):
    """Each classroom example's button names what a run of it shows (a win, a loss, and why); a
    click puts its prompt in the box, says what the example is and where its lesson was measured, and
    takes off the screen the example run of another prompt (its status, cards, race)."""
    buttons = []
    for example in classroom_examples():
        button = page.locator("button", has_text=f"{OUTCOMES[example.outcome]}, {example.lesson}: ")
        assert button.count() == 1, example.lesson
        buttons.append(button)
    winner = next(i for i, e in enumerate(classroom_examples()) if e.outcome == "wins")
    buttons[winner].click()
    page.wait_for_function(
        "([p]) => document.querySelector('#prompt textarea').value === p",
        arg=[classroom_examples()[winner].prompt],
        timeout=30_000,
    )
    page.wait_for_function(
        "document.querySelector('#run-status').innerText.startsWith('Classroom example: speculation wins')",
        timeout=30_000,
    )
    status = page.locator("#run-status").inner_text()
    assert "not runs on this machine" in status and "Example run" not in status
    page.wait_for_function("!document.querySelector('#race .sl-race-play')", timeout=30_000)
    assert page.locator("#timeline [data-round]").count() == 0
    assert page.locator("#cards .sl-card, #cards .sl-recorded").count() == 0
    assert page.locator("#sentence").inner_text().strip() == "Run a prompt first."


def test_theory_simulation(page):
    page.get_by_role("tab", name="Theory").click()
    page.click("#simulate")
    page.wait_for_selector("#sim-timeline [data-round='0']", timeout=30_000)
    page.screenshot(path=ARTIFACTS / "theory.png", full_page=True)


def test_the_concurrency_chart_opens_on_this_machines_measured_v(browser, live_app):
    """Once V(n) was measured on this machine (the Measure button, or `python -m decoding probe`:
    the same function, minutes on a busy 2-core machine, so done here only where it never was),
    a visit's concurrency chart opens on it, not on the slider's b = 0."""
    if cached("smollm2-135m") is None:
        measure(load_model("smollm2-135m"))
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    later = context.new_page()
    later.goto(live_app, wait_until="load")
    later.get_by_role("tab", name="Theory").click()
    later.wait_for_function(
        "document.querySelector('#concurrency-text').innerText.includes('measured on this machine')",
        timeout=60_000,
    )
    assert "not measured on this machine" not in later.locator("#concurrency-text").inner_text()
    measured = later.locator("#measured-text").inner_text()
    assert re.search(r"Measured here for smollm2-135m \(.+\) on \d{4}-\d\d-\d\d:", measured), measured
    names = later.locator("#concurrency-plot .gtitle").text_content()
    assert "V(n) measured here" in names
    context.close()


def test_stop_a_long_run_then_run_again(page):
    page.fill("#prompt textarea", "Write a very long story about a dragon, at least two thousand words.")
    set_number(page, "max-new", 512)
    run(page)
    page.wait_for_selector("#timeline [data-round='2']", timeout=LONG)
    assert page.locator("#run").is_disabled()  # one run at a time from this page
    page.click("#stop")
    page.wait_for_function(
        "document.querySelector('#cards').innerText.includes('stopped by the user')", timeout=60_000
    )
    rounds = page.locator("#timeline [data-round]").count()
    assert 3 <= rounds < 512
    page.wait_for_function("!document.querySelector('#run').disabled", timeout=30_000)
    page.screenshot(path=ARTIFACTS / "stopped.png", full_page=True)

    set_number(page, "max-new", 6)
    run(page)
    page.wait_for_function(
        "document.querySelector('#cards').innerText.includes('identical')"
        " && !document.querySelector('#cards').innerText.includes('stopped')",
        timeout=LONG,
    )


def test_token_text_reaches_the_sentences_as_text(page, tmp_path):
    hostile = ["<img src=x>", "**bold**"]
    step = Round(
        2,
        [DraftToken(1, hostile[0], 0.9), DraftToken(2, hostile[1], 0.8)],
        [Verdict(0.9, 1.0, None, True), Verdict(0.1, 0.0, None, False)],
        1,
        Emitted(3, "<b>x</b>", "correction", 0.7),
        1.0,
        1.0,
        2.0,
    )
    trace = Trace(meta=RunMeta(prompt="<i>hi</i>"), rounds=[step])
    trace.output = Output("x", [1, 3])
    trace.finish(0.01)
    path = tmp_path / "hostile.json"
    trace.save(path)

    page.get_by_role("tab", name="Replay").click()
    page.set_input_files("#upload input[type=file]", str(path))
    page.wait_for_selector("#upload a", timeout=30_000)  # uploaded
    page.click("#load")
    page.wait_for_function(  # the example the tab opened on gives way to the upload
        "document.querySelector('#replay-sentence').innerText.includes('<b>x</b>')", timeout=60_000
    )
    sentence = page.locator("#replay-sentence")
    assert sentence.locator("img, strong, b").count() == 0
    text = sentence.inner_text()
    assert all(h in text for h in [*hostile, "<b>x</b>"]), text
    assert page.locator("#replay-timeline img, #replay-timeline i").count() == 0


def test_production_tab_charts_a_vllm_page(page):
    fake = FakeVLLM()
    fake.observe(30, 2)
    server, url = serve(lambda h: reply(h, fake.page()))
    try:
        page.get_by_role("tab", name="Production").click()
        page.fill("#metrics-url textarea, #metrics-url input", f"{url}/metrics")
        page.click("#read-metrics")
        page.wait_for_function(
            "document.querySelector('#prod-text').innerText.includes('mean acceptance length 3.00')",
            timeout=60_000,
        )
        page.wait_for_selector("#prod-positions .js-plotly-plot .main-svg", timeout=30_000)
        page.screenshot(path=ARTIFACTS / "production.png", full_page=True)
    finally:
        server.shutdown()


def test_the_production_example_names_only_a_k_its_run_drafted(page):
    """The example run drafted 4 tokens a round: the best num_speculative_tokens is among 1-4, and
    its label sits inside the chart."""
    page.get_by_role("tab", name="Production").click()
    page.click("#prod-example")
    page.wait_for_function(
        "document.querySelector('#prod-text').innerText.includes('num_speculative_tokens =')", timeout=60_000
    )
    text = page.locator("#prod-text").inner_text()
    assert 1 <= int(re.search(r"num_speculative_tokens = (\d+)", text)[1]) <= 4, text
    page.wait_for_selector("#prod-best-k .textpoint text", timeout=30_000)
    label = page.locator("#prod-best-k .textpoint text").first.bounding_box()
    area = page.locator("#prod-best-k .nsewdrag").first.bounding_box()
    assert area["y"] <= label["y"] and label["y"] + label["height"] <= area["y"] + area["height"]


def test_a_tree_run_draws_the_tree_of_the_chosen_round(page):
    page.fill("#prompt textarea", "Repeat exactly: red, green, blue. red, green, blue. red, green, blue.")
    set_number(page, "max-new", 12)
    set_number(page, "tree-nodes", 6)
    run(page)
    page.wait_for_selector("#timeline [data-tree-nodes]", timeout=LONG)
    page.wait_for_function(
        "document.querySelector('#tree-plot') && document.querySelector('#tree-plot').innerText.includes('kept')",
        timeout=LONG,
    )
    assert "tree of" in page.locator("#timeline [data-round='0'] .sl-label").inner_text()
    page.locator("#tree-plot").screenshot(path=ARTIFACTS / "tree.png")
    page.locator("h1").first.click()
    page.keyboard.press("ArrowRight")  # the step-through names the tree, not only its main line
    nodes = page.locator("#timeline [data-round='0']").get_attribute("data-tree-nodes")
    assert stepper_at(page).startswith("Round 1 of"), stepper_at(page)
    assert f"proposes a tree of {nodes} tokens; its main line holds" in stepper_at(page)


def test_the_pair_with_two_tokenizers_from_the_sidebar(page):
    """Gemma-3-270M ← SmolLM2-135M: chosen from the pair list, run, and its chips name their draft tokens."""
    page.locator("#pair input").click()
    page.get_by_role("option", name=re.compile("another tokenizer")).click()
    page.fill("#prompt textarea", "What is the capital of France?")
    set_number(page, "max-new", 10)
    run(page)
    page.wait_for_function("document.querySelector('#cards').innerText.includes('identical')", timeout=LONG)
    assert "draft token" in page.locator("#timeline [data-round='0'] .sl-label").inner_text()
    tips = page.locator("#timeline .sl-rounds .sl-tok").evaluate_all(
        "chips => chips.map(c => c.dataset.tip || '')"
    )
    assert any("the draft's own token" in t for t in tips)
    page.screenshot(path=ARTIFACTS / "two-tokenizers.png", full_page=True)


# -- a first visit ------------------------------------------------------------------------------

ERROR_BADGES = """() => [...document.querySelectorAll('.error')]
    .filter(e => !e.closest('.toast-wrap') && !String(e.className).includes('toast')).length"""


def refused(page, message: str, button: str = "#run") -> None:
    """The refusal is one toast with its message; no view is marked; the button is back."""
    page.click(button)
    page.wait_for_function(
        f"[...document.querySelectorAll('.toast-body')].some(t => t.innerText.includes({message!r}))",
        timeout=60_000,
    )
    page.wait_for_function(f"!document.querySelector('{button}').disabled", timeout=30_000)
    assert page.evaluate(ERROR_BADGES) == 0
    page.evaluate("() => document.querySelectorAll('.toast-close').forEach(b => b.click())")


def refused_and_kept(page, message: str) -> None:
    """Refused in Explore: the example run the page opened on stays on show, untouched."""
    refused(page, message)
    assert page.locator("#run-status").inner_text().startswith("Example run")
    assert page.locator("#timeline [data-round]").count() > 10


def test_the_first_load_shows_an_example_run_and_replay_its_example(page):
    page.wait_for_selector("#timeline [data-round]", timeout=60_000)
    assert page.locator("#timeline [data-round]").count() > 10
    assert page.locator("#run-status").inner_text().startswith("Example run")
    assert page.locator("#cards .sl-card").count() >= 4
    # Its cards say it is a recording, made elsewhere: their speedup is not this machine's.
    flag = page.locator("#cards .sl-recorded")
    assert flag.is_visible() and flag.inner_text().startswith("Recorded, not run on this machine")
    assert page.locator("#timeline .sl-template summary").first.inner_text().startswith("chat template")
    page.get_by_role("tab", name="Replay").click()
    page.wait_for_function(
        "document.querySelector('#replay-sentence').innerText.startsWith('Round 1:')", timeout=60_000
    )


def test_refused_inputs_leave_run_usable_and_mark_nothing(page):
    page.wait_for_selector("#timeline [data-round]", timeout=60_000)
    page.fill("#prompt textarea", "   ")
    refused_and_kept(page, "the prompt is empty")
    page.fill("#prompt textarea", "word " * 5000)  # 25,000 characters: past the context
    refused_and_kept(page, "exceeds")
    page.fill("#prompt textarea", "Repeat exactly: red, green, blue. red, green, blue.")
    for name, message in (("no-such-model", "unknown model"), ("someone/some-model", "not reachable")):
        page.fill("#target input", name)
        page.press("#target input", "Enter")
        refused_and_kept(page, message)
    page.fill("#target input", "smollm2-135m")
    page.press("#target input", "Enter")
    set_number(page, "max-new", 8)
    run(page)
    page.wait_for_function(
        "document.querySelector('#trace-json') && document.querySelector('#cards').innerText.includes('identical')"
        " && !document.querySelector('#run-status').innerText.includes('Example')",
        timeout=LONG,
    )
    assert page.evaluate(ERROR_BADGES) == 0
    page.get_by_role("tab", name="Sweep").click()
    page.fill("#sweep-prompt textarea", "")
    refused(page, "the prompt is empty", "#sweep")


def test_the_default_run_says_what_it_shows(page):
    page.wait_for_selector("#timeline [data-round]", timeout=60_000)
    run(page)
    page.wait_for_function(
        "!document.querySelector('#run-status').innerText.includes('Example')"
        " && document.querySelector('#cards').innerText.includes('speedup vs plain')",
        timeout=LONG,
    )
    cards = page.locator("#cards").inner_text()
    speedup = float(re.search(r"×(\d+\.\d+)\??\s*speedup vs plain", cards).group(1))
    assert "identical" in cards
    # Faster or slower, a sentence says why; timings a busy machine spoilt are said to be that.
    why = "Faster than plain decoding:" if speedup >= 1 else "Slower than plain decoding:"
    assert why in cards or BUSY in cards, cards


def test_a_k_typed_past_its_range_is_not_silently_moved(page):
    box = page.get_by_label("number input for k: tokens drafted per round (a tree's depth)")
    for typed, kept in (("0", "1"), ("40", "16")):
        box.fill(typed)
        page.locator("h1").first.click()  # the box loses the focus: Gradio moves the value in range
        assert box.input_value() == kept
        tip = page.locator("#sl-tip")
        assert tip.is_visible(), typed
        assert f"{typed} is outside 1–16, so it is set to {kept}" in tip.inner_text()
    page.screenshot(path=ARTIFACTS / "k-out-of-range.png")


def test_the_pair_box_names_the_pair_only_while_the_settings_are_it(page):
    pair = page.locator("#pair input")
    assert pair.input_value() == "SmolLM2-135M · n-gram + trained head (offline)"  # the default pair
    assert page.get_by_role(
        "radio", name="n-gram where the text repeats, else the head (2 tokens at most a chain round)"
    ).is_checked()
    page.get_by_role("radio", name="suffix decoding (this prompt and this session's runs)").check()
    page.wait_for_function(
        "document.querySelector('#pair input').value.startsWith('Your own choice')", timeout=30_000
    )
    pair.click()
    page.get_by_role("option", name="Gemma-3-270M · n-gram draft (offline)").click()
    page.wait_for_function("document.querySelector('#target input').value === 'gemma3-270m'", timeout=30_000)
    page.wait_for_timeout(1000)  # the settings it set name it again: it stays
    assert pair.input_value() == "Gemma-3-270M · n-gram draft (offline)"
    assert page.get_by_role("radio", name="n-gram (prompt lookup)").is_checked()


def test_a_token_opens_its_popover_on_a_click(page):
    page.wait_for_selector("#timeline [data-round]", timeout=60_000)
    chip = page.locator("#timeline .sl-rounds .sl-tok.sl-accepted").first
    chip.click()
    tip = page.locator("#sl-tip")
    assert tip.is_visible() and "target's probability" in tip.inner_text()
    assert "the target's own top choice" in tip.inner_text()  # the example run is greedy
    page.mouse.move(5, 5)
    assert tip.is_visible()  # pinned: it stays when the pointer leaves
    page.locator("h1").first.click()
    assert not tip.is_visible()


def contrast(page, selector: str) -> float:
    """WCAG contrast between an element's text colour and the background it sits on."""
    return page.evaluate(
        """(sel) => {
          const el = document.querySelector(sel);
          const rgb = (c) => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
          let bg = null;
          for (let e = el; e && !bg; e = e.parentElement) {
            const c = getComputedStyle(e).backgroundColor;
            if (!c.startsWith('rgba(0, 0, 0, 0)') && c !== 'transparent') bg = rgb(c);
          }
          const lum = ([r, g, b]) => [r, g, b].map(v => v / 255)
            .map(v => v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4)
            .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
          const [a, b] = [lum(rgb(getComputedStyle(el).color)), lum(bg || [255, 255, 255])];
          return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        }""",
        selector,
    )


def test_dark_mode_keeps_the_sentence_readable(browser, live_app):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(live_app + "?__theme=dark", wait_until="load")
    page.wait_for_function(
        "document.querySelector('#sentence') && document.querySelector('#sentence').innerText.startsWith('Round 1')",
        timeout=60_000,
    )
    assert page.evaluate("document.body.classList.contains('dark')")
    assert contrast(page, "#sentence p") >= 4.5
    assert contrast(page, "#cards .sl-card-label") >= 4.5
    page.screenshot(path=ARTIFACTS / "explore-dark.png", full_page=True)
    context.close()


@pytest.mark.parametrize("width", [390, 360])
def test_a_phone_sees_the_prompt_run_and_every_tab(browser, live_app, width):
    """Every tab in sight, none behind Gradio's "⋯" menu, down to a 360 px phone: on one line where
    they fit, else wrapped onto a second."""
    context = browser.new_context(viewport={"width": width, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.goto(live_app, wait_until="load")
    page.wait_for_selector("#run", timeout=60_000)
    page.wait_for_timeout(1500)  # the page closes the sidebar once it has loaded
    assert page.locator(".sidebar.open").count() == 0
    box = page.locator("#run").bounding_box()
    assert box is not None and box["y"] + box["height"] <= 900
    tabs = page.get_by_role("tab").all()
    assert {"Explore", "Sweep", "Theory", "Replay", "Production"} <= {t.inner_text() for t in tabs}
    rows = set()
    for tab in tabs:
        assert tab.is_visible(), tab.inner_text()
        where = tab.bounding_box()
        assert where["x"] >= 0 and where["x"] + where["width"] <= width, tab.inner_text()
        rows.add(round(where["y"]))
    assert len(rows) <= 2
    assert not page.locator("button[aria-label='More tabs']").is_visible()
    page.get_by_role("tab", name="Production").click()
    page.locator("#prod-example").wait_for(timeout=30_000)
    page.screenshot(path=ARTIFACTS / f"phone-{width}.png")
    context.close()


def test_a_corrupt_upload_or_an_unreachable_server_is_one_message(page, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"version": 4, "meta": {}, "rounds": [')
    page.get_by_role("tab", name="Replay").click()
    page.wait_for_function(
        "document.querySelector('#replay-sentence').innerText.startsWith('Round 1:')", timeout=60_000
    )
    page.set_input_files("#upload input[type=file]", str(bad))
    page.wait_for_selector("#upload a", timeout=30_000)
    refused(page, "not a SpecLens trace", "#load")
    assert page.locator("#replay-sentence").inner_text().startswith("Round 1:")  # the example stays
    page.get_by_role("tab", name="Production").click()
    page.fill("#metrics-url textarea, #metrics-url input", "http://127.0.0.1:9/metrics")
    refused(page, "127.0.0.1:9", "#read-metrics")


def test_the_race_ends_saying_who_finished_first_and_by_how_much(page):
    example = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")  # the page's
    spec_end, plain_end = example.token_times_s()[-1], example.baseline.token_times_s[-1]
    page.wait_for_selector("#race .sl-race-play", timeout=60_000)
    end = page.locator("#race .sl-race-end")
    assert not end.is_visible()  # not before the race has run
    page.click("#race .sl-race-play")
    page.wait_for_function("document.querySelector('#race .sl-race').dataset.done === '1'", timeout=60_000)
    said = end.inner_text()
    assert end.is_visible() and said.startswith(
        f"First to finish: speculative, 64 tokens in {spec_end:#.3g} s"
    )
    assert (
        f"plain {plain_end - spec_end:#.3g} s later" in said
        and f"×{plain_end / spec_end:.2f} the time" in said
    )
    page.click("#race .sl-race-speed[data-slow='5']")  # a new race: the verdict waits for its end
    assert not end.is_visible()


def test_the_race_replays_both_texts_and_slow_motion_slows_the_clock(page):
    example = Trace.load(
        ROOT / "assets" / "traces" / "summarization-ngram-greedy.json"
    )  # what the page opened on
    page.wait_for_selector("#race .sl-race-play", timeout=60_000)
    page.click("#race .sl-race-play")
    page.wait_for_function("document.querySelector('#race .sl-race').dataset.done === '1'", timeout=60_000)
    lanes = page.locator("#race .sl-lane-text")
    assert lanes.nth(0).text_content() == "".join(spec_tokens(example))
    assert lanes.nth(1).text_content() == "".join(plain_tokens(example))
    page.click("#race .sl-race-speed[data-slow='20']")  # restarts, twenty times slower
    page.wait_for_timeout(1500)
    shown = float(page.locator("#race .sl-race-clock").inner_text().split()[0])
    assert shown < 0.3  # 1.5 s of wall clock is 0.075 s of the run
    assert int(page.locator("#race .sl-lane-count").nth(0).inner_text()) < len(example.output.token_ids)
    page.locator("#race").screenshot(path=ARTIFACTS / "race.png")


def tip_of(page, locator) -> str:
    """Hover `locator`; the popover's text, or empty when none opened."""
    # Playwright's hover may scroll a table's viewport itself, and a scroll closes an unpinned
    # popover: the second hover, once the scroll has ended, is the one a still hand makes.
    locator.hover()
    locator.page.wait_for_timeout(300)
    locator.page.mouse.move(0, 0)
    locator.hover()
    tip = page.locator("#sl-tip")
    return tip.inner_text() if tip.is_visible() else ""


def test_cards_table_headers_and_terms_open_the_glossary(page):
    """One glossary behind every card, every column of the Sweep table, and Production's terms."""
    for label in ("acceptance rate", "tokens per round", "speedup vs plain"):
        card = page.locator("#cards .sl-card", has_text=label).first
        assert glossary.term(label).definition in tip_of(page, card), label
    page.get_by_role("tab", name="Sweep").click()
    headers = page.locator("#sweep-table th")
    headers.first.wait_for(timeout=30_000)
    names = [n.strip() for n in headers.all_inner_texts()]
    # In the glossary's words, not the CSV's column names.
    assert {"α (alpha)", "acceptance rate", "lowest speedup", "identical to plain decoding"} <= set(names)
    assert not [n for n in names if "_" in n], names
    for i, name in enumerate(names):
        assert tip_of(page, headers.nth(i)) == glossary.tip(name), name
    page.get_by_role("tab", name="Production").click()
    for term in ("per-position acceptance (vLLM)", "per-position acceptance (SpecLens)"):
        chip = page.locator("#prod-terms .sl-term", has_text=term)
        assert tip_of(page, chip) == glossary.tip(term)


def test_a_phone_opens_the_glossary_with_a_tap(browser, live_app):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.goto(live_app, wait_until="load")
    page.wait_for_selector("#cards .sl-card", timeout=60_000)
    tip = page.locator("#sl-tip")
    card = page.locator("#cards .sl-card", has_text="acceptance rate").first
    card.scroll_into_view_if_needed()
    page.wait_for_timeout(150)
    card.tap()
    assert tip.is_visible() and glossary.term("acceptance rate").definition in tip.inner_text()
    page.get_by_role("tab", name="Sweep").click()
    header = page.locator("#sweep-table th", has_text="α (alpha)").first
    header.scroll_into_view_if_needed()
    page.wait_for_timeout(150)
    header.tap()
    assert tip.is_visible() and tip.inner_text() == glossary.tip("alpha")
    box, screen = tip.bounding_box(), page.viewport_size
    assert box["x"] >= 0 and box["x"] + box["width"] <= screen["width"]
    page.screenshot(path=ARTIFACTS / "phone-glossary.png")
    context.close()


CHART_BOXES = """() => [...document.querySelectorAll('.js-plotly-plot')].filter((p) => p.offsetParent).map((p) => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const bar = p.querySelector('.modebar');
  return { chart: box(p), modebar: bar && box(bar),
           titles: [...p.querySelectorAll('.gtitle, .xtitle, .ytitle, .y2title')].map((t) => [t.textContent, box(t)]) };
})"""


def overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_a_360_px_phone_sees_every_chart_title_whole_and_clear_of_the_toolbar(browser, live_app):
    context = browser.new_context(viewport={"width": 360, "height": 780}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.goto(live_app, wait_until="load")
    page.wait_for_selector("#cards .sl-card", timeout=60_000)
    charts = []
    for tab in ("Explore", "Theory"):
        page.get_by_role("tab", name=tab).click()
        page.wait_for_selector(".js-plotly-plot:visible .gtitle", timeout=30_000)
        page.wait_for_timeout(1000)  # Plotly lays a chart out again once it knows its width
        charts += page.evaluate(CHART_BOXES)
    assert len(charts) >= 7
    for chart in charts:
        for text, box in chart["titles"]:
            left, top, right, bottom = chart["chart"]
            assert (
                left - 1 <= box[0] and box[2] <= right + 1 and top - 1 <= box[1] and box[3] <= bottom + 1
            ), text
        title = [box for text, box in chart["titles"] if text][0]
        assert chart["modebar"] and not overlap(title, chart["modebar"]), chart
    page.screenshot(path=ARTIFACTS / "phone-charts.png", full_page=True)
    context.close()


def test_the_entropy_strip_names_the_colour_its_bars_have(page):
    """The caption's words for a kind name the colour that kind's bars and legend chip share."""
    strip = page.locator("#timeline .sl-entropy-box")
    strip.wait_for(timeout=60_000)
    caption = strip.locator(".sl-caption").inner_text()
    for kind in ("correction", "accepted"):
        assert f"{KIND_LABELS[kind]} ({KIND_COLOURS[kind]})" in caption, caption
        bar = strip.locator(f".sl-ent-{kind}").first.evaluate("e => getComputedStyle(e).backgroundColor")
        chip = page.locator(f"#timeline .sl-legend .sl-tok.sl-{kind}").evaluate(
            "e => getComputedStyle(e).borderTopColor"
        )
        assert bar == chip, kind
