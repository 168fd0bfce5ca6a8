"""gradio_client against the live app: every endpoint by api_name, on the offline default."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import pytest
from conftest import ROOT
from gradio_client import Client, handle_file
from test_metrics import FakeVLLM, reply, serve

from app import common
from decoding import api, costmodel
from decoding.tools.sweep import SWEEP_COLUMNS
from decoding.trace import Trace, validate
from visualize import glossary

pytestmark = pytest.mark.slow

NGRAM = "n-gram (prompt lookup)"
PROMPT = "Repeat exactly: red, green, blue. red, green, blue. red, green, blue."


def generate_args(prompt=PROMPT, **over):
    args = {
        "prompt": prompt,
        "target": "smollm2-135m",
        "draft_source": NGRAM,
        "n_layers": 10,
        "draft_model": "smollm2-135m",
        "k": 4,
        "tree_nodes": 0,
        "branch": 2,
        "policy": "fixed",
        "confidence": 0.4,
        "temperature": 0,
        "top_k": 0,
        "top_p": 1,
        "seed": 0,
        "max_new_tokens": 20,
        "compare": True,
    }
    args.update(over)
    return args


def sweep_args(prompt=PROMPT, **over):
    args = {
        name: value
        for name, value in generate_args(prompt, **{"max_new_tokens": 16, **over}).items()
        if name != "compare"
    }
    return {
        "sweep_over": "draft length k",
        "k_from": 1,
        "k_to": 3,
        "tree_sizes": "0, 4",
        "repeats": 2,
        "workload": "Spec-Bench dev: every category",
        "workload_file": None,
        "sources": ["n-gram (prompt lookup)", "trained draft head (EAGLE-3)"],
        **args,
    }


def figure_json(fig: dict) -> dict:
    assert fig["type"] == "plotly"
    return json.loads(fig["plot"])


def test_generate_returns_trace_figures_and_downloads(client):
    timeline, text, cards, *figs, json_path, csv_path, round_update, sentence, tree = client.predict(
        **generate_args(), api_name="/generate"
    )
    trace = Trace.load(json_path)
    validate(trace)
    assert trace.meta.prompt == PROMPT and trace.meta.draft == "ngram"
    assert trace.totals.identical_to_baseline is True and trace.totals.speedup > 0
    assert text == trace.output.text and text.strip()
    assert timeline.count("data-round=") == len(trace.rounds)
    assert "identical to plain decoding" in cards
    assert len(figs) == 4 and all(figure_json(f)["data"] for f in figs)
    header = Path(csv_path).read_text().splitlines()[0]
    assert header.startswith("round,position,kind,token_id")
    assert round_update["maximum"] == len(trace.rounds)
    assert sentence.startswith("Round 1: the draft")


def test_every_draft_source_and_sampling(client):
    for over in (
        {"draft_source": "trained draft head (EAGLE-3)", "k": 3},
        {"draft_source": "first N layers of the target", "n_layers": 12, "k": 2},
        {"draft_source": "separate draft model", "policy": "confidence", "k": 6},
        {"temperature": 0.8, "top_p": 0.9, "seed": 3, "policy": "heuristic", "compare": False},
    ):
        *_, json_path, _, _, _, _ = client.predict(
            **generate_args(max_new_tokens=10, **over), api_name="/generate"
        )
        validate(Trace.load(json_path))


def test_the_offline_pair_with_two_tokenizers(client):
    """Gemma-3-270M checks what SmolLM2-135M drafts, as the sidebar's offline pair sets it."""
    over = {
        "target": "gemma3-270m",
        "draft_source": "separate draft model",
        "draft_model": "smollm2-135m",
        "k": 3,
    }
    timeline, text, cards, *_, json_path, _, _, sentence, _ = client.predict(
        **generate_args("What is the capital of France?", max_new_tokens=12, **over), api_name="/generate"
    )
    trace = Trace.load(json_path)
    validate(trace)
    assert trace.meta.draft_kind == "cross" and trace.totals.identical_to_baseline is True
    assert "re-encoded for the target" in timeline or "same text in both vocabularies" in timeline
    assert "another tokenizer" in sentence


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"prompt": "   "}, "prompt is empty"),
        ({"prompt": "x" * 60000}, "50,000 characters"),
        ({"target": "no-such-model"}, "unknown model"),
        ({"target": "someone/some-model"}, "not reachable"),
        ({"draft_source": "first N layers of the target", "n_layers": 40}, "greater than maximum value 29"),
        ({"draft_source": "separate draft model", "draft_model": "nonsense"}, "unknown model"),
        ({"draft_source": "trained draft head (EAGLE-3)", "target": "gemma3-270m"}, "no trained head ships"),
        ({"prompt": "word " * 9000}, "context"),
    ],
)
def test_bad_input_is_an_error_and_the_app_keeps_serving(client, over, message):
    with pytest.raises(Exception, match=message):
        client.predict(**generate_args(**over), api_name="/generate")
    *_, json_path, _, _, _, _ = client.predict(**generate_args(max_new_tokens=4), api_name="/generate")
    assert Trace.load(json_path).totals.new_tokens == 4


def test_time_limit_stops_the_run_and_shows_what_it_has(client, monkeypatch):
    monkeypatch.setattr(common, "TIME_LIMIT_S", 0.0)
    timeline, text, cards, *figs, json_path, csv_path, round_update, sentence, tree = client.predict(
        **generate_args(), api_name="/generate"
    )
    trace = Trace.load(json_path)
    validate(trace)
    assert trace.meta.stopped.startswith("stopped at the 0 s time limit")
    assert 1 <= len(trace.rounds) < 20 and trace.totals.speedup is None  # no comparison after a stop
    assert "time limit" in cards and timeline.count("data-round=") == len(trace.rounds)


def test_the_time_limit_starts_at_the_first_round_not_at_loading(client, monkeypatch):
    real_load = api.load_model

    def slow_load(*args, **kwargs):
        time.sleep(3.0)  # a first conversion, say
        return real_load(*args, **kwargs)

    monkeypatch.setattr(common, "TIME_LIMIT_S", 2.5)
    monkeypatch.setattr(api, "load_model", slow_load)
    *_, json_path, _, _, _, _ = client.predict(
        **generate_args(max_new_tokens=8, compare=False), api_name="/generate"
    )
    trace = Trace.load(json_path)
    assert trace.meta.stopped is None and trace.totals.new_tokens == 8


def test_stop_ends_a_long_run_which_shows_its_rounds_and_the_next_run_works(client):
    job = client.submit(
        **generate_args("Count from one to two hundred.", max_new_tokens=400), api_name="/generate"
    )
    deadline = time.monotonic() + 120
    while not job.outputs() and time.monotonic() < deadline:  # the first rounds have streamed
        time.sleep(0.2)
    client.predict(api_name="/stop_generate")
    *_, json_path, _, _, _, _ = job.result(timeout=120)
    trace = Trace.load(json_path)
    validate(trace)
    assert trace.meta.stopped == "stopped by the user" and 0 < trace.totals.new_tokens < 400
    *_, json_path, _, _, _, _ = client.predict(**generate_args(max_new_tokens=4), api_name="/generate")
    assert Trace.load(json_path).totals.new_tokens == 4


def test_the_sweep_has_the_same_budget(client, monkeypatch):
    """Ended by the budget before a setting finished, a sweep says so in its charts and summary (no
    error in their place, no figure to read as measured)."""
    monkeypatch.setattr(common, "TIME_LIMIT_S", 0.0)
    speedup, tokens, table, csv_path, summary, race = client.predict(**sweep_args(), api_name="/sweep")
    assert summary.startswith("**Nothing measured**: Stopped at the 0 s time limit") and "fewer" in summary
    for figure in (speedup, tokens):
        layout = figure_json(figure)["layout"]
        assert (
            "Nothing measured" in layout["title"]["text"] and "time limit" in layout["annotations"][0]["text"]
        )
        assert figure_json(figure)["data"] == []
    assert csv_path is None and not table["data"] and race["visible"] is False


def test_n_follows_the_targets_layer_count(client):
    assert client.predict("smollm2-135m", 10, api_name="/layer_range")["maximum"] == 29
    update = client.predict("gemma3-270m", 25, api_name="/layer_range")
    assert update["maximum"] == 17 and update["value"] == 17


def test_a_separate_draft_model_must_be_named(client):
    with pytest.raises(Exception, match="choose a draft model"):
        client.predict(
            **generate_args(draft_source="separate draft model", draft_model=""), api_name="/generate"
        )


def test_two_sessions_get_their_own_traces(live_app):
    a, b = (Client(live_app, analytics_enabled=False, verbose=False) for _ in range(2))
    prompts = ["Count: one, two, three, four.", "Name three colours."]
    jobs = [
        c.submit(**generate_args(p, max_new_tokens=12), api_name="/generate") for c, p in zip((a, b), prompts)
    ]
    for job, prompt in zip(jobs, prompts):
        *_, json_path, _, _, _, _ = job.result(timeout=300)
        assert Trace.load(json_path).meta.prompt == prompt


def test_sweep(client):
    speedup, acceptance, table, csv_path, summary, race = client.predict(**sweep_args(), api_name="/sweep")
    assert race["visible"] is False
    assert [row[0] for row in table["data"]] == [1, 2, 3]
    # Headed in the glossary's words; the CSV keeps the columns' names.
    assert table["headers"] == [glossary.header(c) for c in (*SWEEP_COLUMNS, "best")]
    assert (
        table["headers"][:3] == ["k", "acceptance rate", "α (alpha)"] and "lowest speedup" in table["headers"]
    )
    assert not any("_" in h for h in table["headers"])
    names = [d.get("name") for d in figure_json(speedup)["data"]]
    assert {"measured", "Leviathan (V = 1 step)", "measured verify cost"} <= set(names)
    # A best k is starred only where it beats the others beyond their spread; the summary says which.
    assert ("best" in names) == ("Best k =" in summary) and (
        "Best k =" in summary or "No clear best k" in summary
    )
    assert Path(csv_path).read_text().startswith("k,acceptance_rate")


def test_a_tree_run_draws_its_tree_and_the_sweep_sweeps_tree_sizes(client):
    *_, json_path, _, _, sentence, tree = client.predict(
        **generate_args(max_new_tokens=12, tree_nodes=6, draft_source="trained draft head (EAGLE-3)"),
        api_name="/generate",
    )
    trace = Trace.load(json_path)
    validate(trace)
    assert trace.meta.tree_nodes == 6 and all(r.tree is not None for r in trace.rounds)
    assert trace.totals.identical_to_baseline is True
    assert "a tree of" in sentence
    names = {d.get("name") for d in figure_json(tree["value"])["data"]}  # shown: a tree round
    assert "accepted path" in names and "last verified" in names
    speedup, cost, table, csv_path, summary, _ = client.predict(
        **sweep_args(sweep_over="tree size N (depth k)", tree_sizes="4, 0", k=3), api_name="/sweep"
    )
    assert [row[0] for row in table["data"]] == [0, 4] and (
        "Best N =" in summary or "No clear best N" in summary
    )
    assert Path(csv_path).read_text().startswith("nodes,tokens_per_round")
    with pytest.raises(Exception, match="tree sizes are whole numbers"):
        client.predict(**sweep_args(sweep_over="tree size N (depth k)", tree_sizes="four"), api_name="/sweep")


def test_the_sweep_sweeps_k_over_a_workload_per_category(client, tmp_path):
    over = dict(sweep_over="k over a workload", k_from=1, k_to=2, repeats=1, max_new_tokens=6)
    speedup, tokens, table, csv_path, summary, _ = client.predict(
        **sweep_args(workload="Spec-Bench dev: translation", **over), api_name="/sweep"
    )
    # One category: no "all" rows repeating it; the summary counts what the table holds.
    assert [(row[0], row[1], row[2]) for row in table["data"]] == [
        ("translation", 1, 2),
        ("translation", 2, 2),
    ]
    assert (
        "2 prompts × 2 k × 1 repeat " in summary
        and "**translation**:" in summary
        and "**all**" not in summary
    )
    assert {d.get("name") for d in figure_json(speedup)["data"]} == {"translation"}
    assert Path(csv_path).read_text().startswith("category,k,prompts")
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"prompt": "Say hi.", "category": "greetings"}\n{"prompt": "Count to three."}\n')
    *_, table, _, summary, _ = client.predict(
        **sweep_args(workload_file=handle_file(str(mine)), **over), api_name="/sweep"
    )
    assert {row[0] for row in table["data"]} == {"greetings", "all"} and "3 k" not in summary
    mine.write_text('{"prompt": "Say hi."}\nnot json\n')
    with pytest.raises(Exception, match="mine.jsonl:2"):
        client.predict(**sweep_args(workload_file=handle_file(str(mine)), **over), api_name="/sweep")


def test_the_sweep_compares_draft_sources_and_races_them(client):
    sources = [
        "n-gram (prompt lookup)",
        "trained draft head (EAGLE-3)",
        "n-gram where the text repeats, else the head (2 tokens at most a chain round)",
    ]
    over = dict(sweep_over="draft sources", sources=sources, repeats=1, max_new_tokens=12)
    speedup, tokens, table, csv_path, summary, race = client.predict(**sweep_args(**over), api_name="/sweep")
    assert [row[0] for row in table["data"]] == ["ngram", "head", "ngram+head"]
    assert "all identical to plain decoding ✓" in summary and "No clear best source" in summary  # one repeat
    lanes = re.findall(r'data-lane="([^"]+)"', race["value"])
    assert lanes == [lane for d in ("ngram", "head", "ngram+head") for lane in (d, f"plain, before {d}")]
    assert race["visible"] is True
    # Each source against its own plain run: the race's speedups are the table's.
    end = html.unescape(re.search(r'class="sl-race-end" hidden>([^<]*)<', race["value"]).group(1))
    speedups = [row[table["headers"].index("speedup vs plain")] for row in table["data"]]
    raced = [float(x) for x in re.findall(r"×(\d+\.\d\d)", end)]
    assert raced == pytest.approx(speedups, abs=0.006), end  # the table's to 3 places, the race's to 2
    assert Path(csv_path).read_text().startswith("draft,acceptance_rate")
    with pytest.raises(Exception, match="tick two draft sources or more"):
        client.predict(**sweep_args(**(over | {"sources": sources[:1]})), api_name="/sweep")


def test_suffix_decoding_learns_from_this_sessions_runs_only(client, live_app):
    """The second run of a prompt drafts from the first one's output; another visitor's first run
    does not: each session has its own corpus."""
    suffix = dict(
        draft_source="suffix decoding (this prompt and this session's runs)", max_new_tokens=32, compare=False
    )
    prompt = "Write two sentences about a lighthouse keeper and her cat."

    def run(c) -> Trace:
        *_, json_path, _, _, _, _ = c.predict(**generate_args(prompt, **suffix), api_name="/generate")
        return Trace.load(json_path)

    first, second = run(client), run(client)
    assert first.output.token_ids == second.output.token_ids and second.meta.draft == "suffix"
    assert second.totals.tokens_per_round > first.totals.tokens_per_round + 1
    other = run(Client(live_app, analytics_enabled=False, verbose=False))
    assert other.totals.accepted == first.totals.accepted  # nothing of the first visitor's run
    with pytest.raises(Exception, match="suffix decoding learns from this session's earlier runs"):
        client.predict(
            **sweep_args(draft_source="suffix decoding (this prompt and this session's runs)"),
            api_name="/sweep",
        )


def test_theory_and_simulate(client):
    fig, text = client.predict(0.8, 0.0, 0.0, 10, api_name="/theory")
    assert "γ = 10" in text  # free drafts and free verification: longer is always better
    assert len(figure_json(fig)["data"]) == 2
    fig, text = client.predict(0.8, 0.1, 0.5, 10, api_name="/theory")
    assert "γ = 10" not in text and len(figure_json(fig)["data"]) == 3
    result = client.predict("smollm2-135m", api_name="/measure_verify")
    text = result[-1] if isinstance(result, tuple | list) else result
    assert "Measured here for **smollm2-135m**" in text and "V(17)/V(1) = " in text
    fig, text = client.predict(0.6, 0.2, 3, 4, 0.05, 0.1, api_name="/tree_theory")
    assert "fastest at **N =" in text and len(figure_json(fig)["data"]) == 3
    timeline, sentence = client.predict(0.7, 3, 2, 0, api_name="/simulate")
    assert timeline.count("data-round=") == 2 and "2 rounds gave" in sentence
    spread = 2 * costmodel.tokens_per_round_sd(0.7, 3) / 2**0.5  # two standard errors of the mean
    assert f"19 runs in 20 land within ±{spread:.2f} of it" in sentence


def test_replay_examples_and_upload(client):
    example = sorted((ROOT / "assets" / "traces").glob("*.json"))[0]
    round_update, timeline, sentence, tree, cards, *figs = client.predict(
        None, example.stem, api_name="/replay"
    )
    n = len(Trace.load(example).rounds)
    assert round_update["maximum"] == n and sentence.startswith("Round 1:")
    # Every round is there for the step-through; those after the first wait hidden.
    assert timeline.count("data-round=") == n and timeline.count("sl-later") == n - 1 and len(figs) == 4
    _, timeline, sentence, *_ = client.predict(handle_file(str(example)), None, api_name="/replay")
    assert sentence.startswith("Round 1:")
    with pytest.raises(Exception, match="upload a trace"):
        client.predict(None, None, api_name="/replay")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["rounds"][0].update(n_accepted=7), "round 1: n_accepted 7 is outside"),
        (lambda d: d["output"].update(token_ids=[1, 2]), "do not rebuild the output"),
        (lambda d: d.update(rounds="x"), "not a SpecLens trace"),
    ],
)
def test_a_corrupt_upload_is_refused_naming_its_first_problem(client, tmp_path, mutate, message):
    example = sorted((ROOT / "assets" / "traces").glob("*.json"))[0]
    data = Trace.load(example).to_dict()  # today's shape; the file is version 2
    mutate(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(Exception, match=message):
        client.predict(handle_file(str(bad)), None, api_name="/replay")


def test_a_binary_upload_is_refused_in_one_speclens_sentence(client, tmp_path):
    picture = tmp_path / "picture.json"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(Exception) as refused:
        client.predict(handle_file(str(picture)), None, api_name="/replay")
    message = str(refused.value)
    assert "not a SpecLens trace: the file is not text" in message
    assert "codec" not in message and "byte" not in message


def test_production_tab_reads_a_deployment_beside_this_run(client):
    fake = FakeVLLM()
    fake.observe(40, 2)
    fake.observe(10, 3)
    server, url = serve(lambda h: reply(h, fake.page()))
    try:
        client.predict(**generate_args(max_new_tokens=12, compare=False), api_name="/generate")
        positions, best_k, text, page = client.predict(
            f"{url}/metrics", None, None, 0.05, 0.0, api_name="/production"
        )
    finally:
        server.shutdown()
    data = figure_json(positions)["data"]
    assert [d["name"] for d in data] == ["vllm deployment", "this SpecLens run"]
    assert data[0]["y"] == pytest.approx([1.0, 1.0, 0.2])
    assert "mean acceptance length **3.20**" in text and "num_speculative_tokens" in text
    assert any(d.get("name") == "best" for d in figure_json(best_k)["data"])
    assert "speclens:spec_decode_num_drafts_total" in Path(page).read_text()
    with pytest.raises(Exception, match="cannot read metrics"):
        client.predict("http://127.0.0.1:9/metrics", None, None, 0.05, 0.0, api_name="/production")
    with pytest.raises(Exception, match="give a metrics URL"):
        client.predict("", None, None, 0.05, 0.0, api_name="/production")
