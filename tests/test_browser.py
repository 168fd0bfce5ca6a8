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

from decoding.trace import DraftToken, Emitted, Output, Round, RunMeta, Trace, Verdict, validate
from visualize.race import plain_tokens, spec_tokens

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
    assert "2 prompts × 2 k × 1 repeats" in summary and "all:" in summary
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
    assert lanes == ["plain", "ngram", "head", "ngram+head"]
    page.click("#sweep-race .sl-race-play")
    page.wait_for_function(
        "document.querySelector('#sweep-race .sl-race').dataset.done === '1'", timeout=30_000
    )
    counts = page.locator("#sweep-race .sl-lane-count").all_inner_texts()
    assert len(set(counts)) == 1 and int(counts[0]) > 0  # every lane wrote every token in the end
    page.screenshot(path=ARTIFACTS / "sweep-sources.png", full_page=True)


def test_explore_steps_through_each_round_stage_by_stage(page):
    """The example run, built up one stage at a time: next and previous move one stage, the arrow
    keys too, and "show all" gives back every round."""
    timeline = page.locator("#timeline")
    page.wait_for_selector("#timeline .sl-stepper", timeout=60_000)
    rounds = timeline.locator(".sl-round").count()
    where = timeline.locator(".sl-step-where")

    def state() -> tuple[str, int, int]:
        visible = timeline.locator(".sl-round:not(.sl-future)").count()
        return where.inner_text(), visible, timeline.locator(".sl-pending").count()

    timeline.locator(".sl-step-next").click()
    first = state()
    assert first[0].startswith(f"Round 1 of {rounds}:") and first[1] == 1
    drafts = timeline.locator(".sl-round").first.locator("[data-step='draft']").count()
    assert first[2] == drafts  # the draft's tokens shown, none judged yet
    timeline.locator(".sl-step-next").click()
    second = state()
    assert second != first and (second[2] == drafts - 1 or second[0].startswith("Round 2"))
    timeline.locator(".sl-step-prev").click()
    assert state() == first
    timeline.locator(".sl-step-next").press("ArrowRight")
    assert state() == second
    page.screenshot(path=ARTIFACTS / "explore-step-through.png", full_page=True)
    timeline.locator(".sl-step-all").click()
    assert timeline.locator(".sl-round:not(.sl-future)").count() == rounds and state()[2] == 0


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
    assert page.locator("#replay-timeline [data-round]").count() == 3
    assert page.locator("#replay-timeline .sl-selected[data-round='2']").count() == 1
    page.click("#prev")
    page.wait_for_function(
        "document.querySelector('#replay-sentence').innerText.startsWith('Round 2:')", timeout=30_000
    )
    page.screenshot(path=ARTIFACTS / "replay.png", full_page=True)


def test_theory_simulation(page):
    page.get_by_role("tab", name="Theory").click()
    page.click("#simulate")
    page.wait_for_selector("#sim-timeline [data-round='0']", timeout=30_000)
    page.screenshot(path=ARTIFACTS / "theory.png", full_page=True)


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
    assert page.locator("#timeline .sl-template summary").first.inner_text() == "chat template"
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
    speedup = float(re.search(r"×(\d+\.\d+)\s*speedup vs plain", cards).group(1))
    assert "identical" in cards
    assert speedup >= 1 or "Slower than plain decoding: the draft was right" in cards, cards


def test_a_token_opens_its_popover_on_a_click(page):
    page.wait_for_selector("#timeline [data-round]", timeout=60_000)
    chip = page.locator("#timeline .sl-rounds .sl-tok.sl-accepted").first
    chip.click()
    tip = page.locator("#sl-tip")
    assert tip.is_visible() and "target's probability" in tip.inner_text()
    assert "chance to keep" in tip.inner_text()
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


def test_a_phone_sees_the_prompt_run_and_every_tab(browser, live_app):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.goto(live_app, wait_until="load")
    page.wait_for_selector("#run", timeout=60_000)
    page.wait_for_timeout(1500)  # the page closes the sidebar once it has loaded
    assert page.locator(".sidebar.open").count() == 0
    box = page.locator("#run").bounding_box()
    assert box is not None and box["y"] + box["height"] <= 900
    for name in ("Explore", "Sweep", "Theory", "Replay", "Production"):
        assert page.get_by_role("tab", name=name).is_visible(), name
    page.get_by_role("tab", name="Production").click()
    page.locator("#prod-example").wait_for(timeout=30_000)
    page.screenshot(path=ARTIFACTS / "phone.png")
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
