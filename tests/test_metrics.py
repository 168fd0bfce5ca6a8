"""The production view: vLLM / SGLang metrics pages, read from real HTTP servers on 127.0.0.1.

The pages are written by prometheus_client itself, with the names, labels,
`_total`/`_created` samples and HELP/TYPE lines vLLM V1 and SGLang expose.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest
import torch
from conftest import ROOT
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from app.tabs.production import production_example, run_production
from decoding import costmodel
from decoding.core.speculative import speculative_generate
from decoding.drafts import NGramDraft
from decoding.errors import SpecLensError
from decoding.settings.policies import make_policy
from decoding.tools import metrics
from decoding.tools.cli import main
from decoding.trace import Trace

K = 3  # the fake engine's num_speculative_tokens


class FakeVLLM:
    """vLLM V1's spec-decode counters, labelled by model and engine, moved by completions."""

    def __init__(self, engines_: int = 1) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.c = {
            name: Counter(f"vllm:spec_decode_{name}", name, labels, registry=self.registry)
            for name in metrics.COUNTERS
        }
        self.per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*labels, "position"],
            registry=self.registry,
        )
        self.engines = [("m", str(i)) for i in range(engines_)]
        for lv in self.engines:  # vLLM creates every series up front, at zero
            for c in self.c.values():
                c.labels(*lv)
            for pos in range(K):
                self.per_pos.labels(*lv, str(pos))

    def observe(self, drafts: int, accepted_each: int, engine: int = 0) -> None:
        """`drafts` drafts of K tokens, each with its first `accepted_each` accepted."""
        lv = self.engines[engine]
        self.c["num_drafts"].labels(*lv).inc(drafts)
        self.c["num_draft_tokens"].labels(*lv).inc(drafts * K)
        self.c["num_accepted_tokens"].labels(*lv).inc(drafts * accepted_each)
        for pos in range(accepted_each):
            self.per_pos.labels(*lv, str(pos)).inc(drafts)

    def page(self) -> str:
        return generate_latest(self.registry).decode()


def accepted_for(prompt: str) -> int:
    return len(prompt) % (K + 1)


def serve(handler_for) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            handler_for(self)

        do_POST = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def reply(h: BaseHTTPRequestHandler, body: str | bytes, kind: str = "text/plain") -> None:
    data = body.encode() if isinstance(body, str) else body
    h.send_response(200)
    h.send_header("Content-Type", kind)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


@pytest.fixture
def vllm():
    """A small OpenAI-compatible server with a vLLM metrics page: each completion is 10 drafts."""
    fake = FakeVLLM()

    def handle(h):
        if h.path == "/metrics":
            reply(h, fake.page())
        elif h.path == "/v1/models":
            reply(h, json.dumps({"data": [{"id": "fake-model"}]}), "application/json")
        elif h.path == "/v1/completions":
            req = json.loads(h.rfile.read(int(h.headers["Content-Length"])))
            assert req["temperature"] == 0 and req["model"] == "fake-model"
            a = accepted_for(req["prompt"])
            fake.observe(10, a)
            usage = {"prompt_tokens": len(req["prompt"].split()), "completion_tokens": 10 * (1 + a)}
            reply(h, json.dumps({"choices": [{"text": "ok"}], "usage": usage}), "application/json")
        else:
            h.send_error(404)

    server, url = serve(handle)
    yield fake, url
    server.shutdown()


def test_a_vllm_page_by_url_gives_vllms_figures(vllm):
    fake, url = vllm
    fake.observe(10, 3)
    fake.observe(30, 1)
    figures = metrics.summary(metrics.read(f"{url}/metrics"))
    assert figures["engine"] == "vllm"
    assert (figures["num_drafts"], figures["num_draft_tokens"], figures["num_accepted_tokens"]) == (
        40,
        120,
        60,
    )
    assert figures["mean_acceptance_length"] == pytest.approx(1 + 60 / 40)
    assert figures["acceptance_rate"] == pytest.approx(60 / 120)
    assert figures["per_position"] == pytest.approx([40 / 40, 10 / 40, 10 / 40])


def test_engines_are_summed_and_the_interval_has_rates(tmp_path):
    fake = FakeVLLM(engines_=2)
    fake.observe(10, 2, engine=0)
    first = tmp_path / "a.prom"
    first.write_text(fake.page())
    fake.observe(20, 1, engine=1)
    fake.observe(10, 3, engine=0)
    second = tmp_path / "b.prom"
    second.write_text(fake.page())
    os.utime(first, (1000.0, 1000.0))
    os.utime(second, (1010.0, 1010.0))  # saved ten seconds apart
    a, b = metrics.read(str(first)), metrics.read(str(second))
    assert metrics.summary(b)["num_drafts"] == 40
    over = metrics.interval(a, b)
    assert over["num_drafts"] == 30 and over["num_accepted_tokens"] == 20 + 30
    assert over["per_position"] == pytest.approx([1.0, 10 / 30, 10 / 30])
    assert over["accepted_tokens_per_s"] == pytest.approx(5.0) and over[
        "drafted_tokens_per_s"
    ] == pytest.approx(9.0)


def test_an_sglang_page():
    registry = CollectorRegistry()
    Gauge("sglang:spec_accept_length", "Average acceptance length", ["model_name"], registry=registry).labels(
        "m"
    ).set(2.65)
    Gauge("sglang:spec_accept_rate", "Average acceptance rate", ["model_name"], registry=registry).labels(
        "m"
    ).set(0.55)
    Gauge("sglang:num_running_reqs", "Running requests", ["model_name"], registry=registry).labels("m").set(3)
    server, url = serve(lambda h: reply(h, generate_latest(registry)))
    try:
        figures = metrics.summary(metrics.read(f"{url}/metrics"))
    finally:
        server.shutdown()
    assert figures["engine"] == "sglang" and figures["per_position"] == []
    assert figures["mean_acceptance_length"] == pytest.approx(2.65)
    assert figures["acceptance_rate"] == pytest.approx(0.55)


def test_speclenss_own_export_reads_back_with_the_same_figures(tiny_target, tmp_path):

    prompt = torch.tensor([[1, 5, 9, 3, 7, 5, 9, 3, 7, 5, 9]])
    trace = speculative_generate(
        tiny_target, prompt, NGramDraft(), make_policy("fixed", 4), max_new_tokens=40
    )
    ours = metrics.snapshot_of([trace])
    page = tmp_path / "speclens.prom"
    page.write_text(metrics.metrics_page(ours))
    assert "speclens:spec_decode_num_drafts_total" in page.read_text()
    back = metrics.summary(metrics.read(str(page)))
    drafted = [s for s in trace.rounds if s.drafted]
    assert back["engine"] == "speclens" and back["num_drafts"] == len(drafted)
    assert back["num_accepted_tokens"] == trace.totals.accepted
    assert back["acceptance_rate"] == pytest.approx(trace.totals.acceptance_rate)
    # vLLM's mean acceptance length is SpecLens's tokens per round, over rounds that drafted.
    assert back["mean_acceptance_length"] == pytest.approx(sum(s.new_tokens for s in drafted) / len(drafted))
    reached = costmodel.acceptance_by_position(trace)
    assert back["per_position"][0] == pytest.approx(reached[0][2] / len(drafted))
    trace_file = tmp_path / "trace.json"
    trace.save(trace_file)  # a saved trace reads as the page its run would export
    assert metrics.summary(metrics.read(str(trace_file))) == back


def test_unreachable_url_answers_at_once():
    server, url = serve(lambda h: None)
    # Stop serving first: a serve_forever left polling a closed socket spins and
    # starves every later test of the CPU (it made the whole suite ×3 slower).
    server.shutdown()
    server.server_close()  # nothing listens there now
    start = time.monotonic()
    with pytest.raises(SpecLensError, match="cannot read metrics"):
        metrics.read(f"{url}/metrics")
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("# HELP up Up.\n# TYPE up gauge\nup 1.0\n", "no speculative-decoding metrics"),
        ("this is not { a metrics page", "not a Prometheus metrics page|no speculative-decoding"),
    ],
)
def test_pages_without_spec_decode_metrics(tmp_path, page, message):
    path = tmp_path / "p.prom"
    path.write_text(page)
    with pytest.raises(SpecLensError, match=message):
        metrics.read(str(path))


def test_counters_that_went_down_mean_a_restart(tmp_path):
    fake = FakeVLLM()
    fake.observe(20, 2)
    before = metrics.parse(fake.page())
    restarted = FakeVLLM()
    restarted.observe(5, 1)
    with pytest.raises(SpecLensError, match="restarted"):
        metrics.between(before, metrics.parse(restarted.page()))


def test_a_huge_page_is_refused_by_url_and_by_file(tmp_path):
    huge = b"# a comment line that goes on\n" * (metrics.MAX_PAGE_BYTES // 30 + 10)
    server, url = serve(lambda h: reply(h, huge))
    try:
        with pytest.raises(SpecLensError, match="over 8 MB"):
            metrics.read(f"{url}/metrics")
    finally:
        server.shutdown()
    path = tmp_path / "huge.prom"
    path.write_bytes(huge)
    with pytest.raises(SpecLensError, match="over 8 MB"):
        metrics.read(str(path))


def test_metrics_command_json_and_table(vllm, capsys):
    fake, url = vllm
    fake.observe(10, 2)
    assert main(["metrics", f"{url}/metrics", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {
        "mean_acceptance_length",
        "acceptance_rate",
        "per_position",
        "num_drafts",
        "num_draft_tokens",
        "num_accepted_tokens",
        "engine",
    }
    assert data["mean_acceptance_length"] == pytest.approx(3.0) and data["per_position"] == [1.0, 1.0, 0.0]
    assert main(["metrics", f"{url}/metrics"]) == 0
    assert "mean acceptance length  3.00" in capsys.readouterr().out
    assert main(["metrics", "http://127.0.0.1:9/metrics"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read metrics") and "\n" not in err.strip()


def test_bench_against_a_server_measures_each_category_by_its_counts(vllm, tmp_path, capsys):
    fake, url = vllm
    fake.observe(50, 3)  # traffic from before the benchmark must not count
    prompts = tmp_path / "p.jsonl"
    rows = [
        ("qa", "why?"),
        ("qa", "why so?"),
        ("rag", "read this then answer"),
        ("rag", "read"),
        ("math", "1+1"),
    ]
    prompts.write_text("\n".join(json.dumps({"category": c, "prompt": p}) for c, p in rows))
    out = tmp_path / "bench"
    args = ["bench", "--server", url, "--prompts", str(prompts), "--limit", "2", "--out", str(out)]
    assert main([*args, "--max-new-tokens", "32"]) == 0
    df = pd.read_csv(out / "results.csv")
    assert list(df["category"]) == [c for c, _ in rows]
    for (_, prompt), r in zip(rows, df.itertuples()):
        a = accepted_for(prompt)
        assert (r.num_drafts, r.num_draft_tokens, r.num_accepted_tokens) == (10, 30, 10 * a)
        assert r.mean_acceptance_length == pytest.approx(1 + a)
        assert json.loads(r.per_position) == [1.0] * a + [0.0] * (K - a)
    summary = (out / "summary.md").read_text()
    for category in ("qa", "rag", "math"):
        mine = [accepted_for(p) for c, p in rows if c == category]
        assert (
            f"| {category} | {len(mine)} | {sum(mine) / (K * len(mine)):.0%} | {1 + sum(mine) / len(mine):.2f} |"
            in summary
        )
    assert json.loads((out / "meta.json").read_text())["model"] == "fake-model"


def test_best_k_from_a_measured_profile():
    per_position = [0.8, 0.6, 0.4]
    assert costmodel.expected_tokens_profile(per_position, 3) == pytest.approx(2.8)
    assert costmodel.expected_tokens_profile(per_position, 4) == pytest.approx(2.8 + 0.4 * 0.4 / 0.6)
    free = costmodel.linear_verify(0.0)
    k, speedups = costmodel.best_k_profile(per_position, 0.0, free, k_max=8)
    assert k == 8 and speedups[2] == pytest.approx(2.8)  # free drafts and checks: longer is better
    k, speedups = costmodel.best_k_profile(per_position, 0.1, costmodel.linear_verify(0.3), k_max=8)
    assert k == 2 and speedups[1] == pytest.approx(2.4 / 1.8)  # 1.8/1.4, 2.4/1.8, 2.8/2.2, ...
    k, _ = costmodel.best_k_profile(per_position, 0.1, costmodel.linear_verify(0.6), k_max=8)
    assert k == 1  # costly checking: the first position alone pays
    k, _ = costmodel.best_k_profile(per_position, 0.0, {1: 1.0, 2: 1.0, 3: 2.0}.get, k_max=2)
    assert k == 1  # a measured V: checking 3 tokens costs two steps, so k = 2 loses to k = 1


def test_the_best_k_is_chosen_only_among_the_k_acceptance_was_measured_for():
    fake = FakeVLLM()
    fake.observe(40, 2)
    fake.observe(10, 3)
    figures = metrics.summary(metrics.parse(fake.page()))
    choice = metrics.choose_k(figures, 0.0, costmodel.linear_verify(0.0))
    assert (choice.best, choice.measured, len(choice.speedups)) == (K, K, K) and not choice.assumed
    sglang = {"per_position": [], "acceptance_rate": 0.5, "mean_acceptance_length": 2.0}
    assert metrics.choose_k(sglang, 0.0, costmodel.linear_verify(0.0)).assumed


def test_the_production_example_recommends_no_k_its_run_did_not_draft(tmp_path, monkeypatch):
    """The example run drafted 4 tokens a round: free drafts and checks favour the longest k, and
    the longest it may name is 4. Nothing measured V(n) in this cache: the slider's b, said so."""
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path))
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    _, best_k, text, _ = production_example(0.0, 0.0, trace.to_dict())
    assert trace.meta.policy.k == 4 and "**num_speculative_tokens = 4**" in text
    assert "among the k = 1–4" in text and "not measured for smollm2-135m on this machine" in text
    assert max(best_k.data[0].x) == 4


def test_position_labels_cannot_size_a_list():
    page = (
        "# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total 4.0\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n"
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 2.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="999999999"} 1.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x"} 1.0\n'
    )
    assert metrics.summary(metrics.parse(page))["per_position"] == [0.5]


def test_drafts_and_rounds_are_counted_one_way_across_explore_and_production(tmp_path, monkeypatch):
    """vLLM's num_drafts counts the rounds that drafted, Explore every round: Production says both,
    and its mean acceptance length and Explore's tokens per round are counts of the same rounds."""
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path))
    trace = Trace.load(ROOT / "assets" / "traces" / "summarization-ngram-greedy.json")
    rounds, drafts = len(trace.rounds), sum(1 for r in trace.rounds if r.drafted)
    assert rounds - drafts == 3  # the example has rounds that drafted nothing
    _, _, text, _ = production_example(0.0, 0.0, trace.to_dict())
    length = 1 + trace.totals.accepted / drafts
    assert f"mean acceptance length **{length:.2f}**" in text
    assert f"{drafts} drafts (vLLM's num_drafts: the rounds that drafted)" in text
    assert (
        f"{rounds} rounds, {drafts} of which drafted" in text
        and "not the 3 rounds that drafted nothing" in text
    )
    assert f"1 + {trace.totals.accepted} accepted / {drafts} drafts = **{length:.2f}**" in text
    per_round = (
        f"{trace.totals.new_tokens} tokens / {rounds} rounds = **{trace.totals.tokens_per_round:.2f}**"
    )
    assert per_round in text
    # Beside a deployment's page, the Explore run is counted the same way.
    fake = FakeVLLM()
    fake.observe(40, 2)
    page = tmp_path / "vllm.prom"
    page.write_text(fake.page())
    _, _, beside, _ = run_production(None, str(page), None, 0.0, 0.0, trace.to_dict())
    assert (
        "40 drafts (vLLM's num_drafts" in beside and f"{rounds} rounds, {drafts} of which drafted" in beside
    )
