"""The app under load, faults and time: bounded versions of what a public Space lives through.

Only 127.0.0.1; every loop is bounded in count and time. Figures land in
artifacts/reliability.json (the README quotes them).
"""

from __future__ import annotations

import json
import os
import statistics
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT
from gradio_client import Client, handle_file
from test_app_client import generate_args, sweep_args

from app import common
from app.tabs import explore
from decoding import api
from decoding.drafts import NGramDraft
from decoding.trace import Trace

pytestmark = pytest.mark.slow
ARTIFACTS = Path(os.environ.get("SPECLENS_ARTIFACTS", ROOT / "artifacts"))
# CI runs 8 sessions; scripts or a bigger machine can ask for more.
SESSIONS = int(os.environ.get("SPECLENS_LOAD_SESSIONS", "8"))


def record(name: str, figures: dict) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "reliability.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = figures
    path.write_text(json.dumps(data, indent=1))
    print(name, figures)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def one_session(url: str, i: int) -> list[dict]:
    """Two short runs, a two-point sweep every fourth session, and a replay; each checked as its own."""
    client = Client(url, analytics_enabled=False, verbose=False)
    done = []
    for j in range(2):
        prompt = f"Session {i} run {j}: count to five."
        start = time.monotonic()
        *_, json_path, _, _, _, _ = client.predict(
            **generate_args(prompt, max_new_tokens=6), api_name="/generate"
        )
        total = time.monotonic() - start
        trace = Trace.load(json_path)
        assert trace.meta.prompt == prompt, "another session's trace"
        work = trace.totals.wall_s + trace.baseline.wall_s
        done.append({"kind": "generate", "total": total, "running": work})
    if i % 4 == 0:
        start = time.monotonic()
        prompt = f"Session {i} sweep: a, b, a, b, a, b."
        table = client.predict(
            **sweep_args(prompt, max_new_tokens=4, draft_model="", k_to=2), api_name="/sweep"
        )[2]
        assert [row[0] for row in table["data"]] == [1, 2]
        done.append({"kind": "sweep", "total": time.monotonic() - start, "running": None})
    example = sorted((ROOT / "assets" / "traces").glob("*.json"))[i % 3]
    start = time.monotonic()
    assert client.predict(None, example.stem, api_name="/replay")[0]["maximum"] == len(
        Trace.load(example).rounds
    )
    done.append({"kind": "replay", "total": time.monotonic() - start, "running": None})
    return done


def test_many_sessions_at_once_each_get_their_own_results(live_app):
    start = time.monotonic()
    with ThreadPoolExecutor(SESSIONS) as pool:
        results = [r for rs in pool.map(lambda i: one_session(live_app, i), range(SESSIONS)) for r in rs]
    runs = [r for r in results if r["kind"] == "generate"]
    waiting = [r["total"] - r["running"] for r in runs]
    record(
        "load",
        {
            "sessions": SESSIONS,
            "requests": len(results),
            "wall_s": round(time.monotonic() - start, 1),
            "generate_p50_s": round(percentile([r["total"] for r in runs], 0.5), 2),
            "generate_p95_s": round(percentile([r["total"] for r in runs], 0.95), 2),
            "waiting_p50_s": round(percentile(waiting, 0.5), 2),
            "waiting_p95_s": round(percentile(waiting, 0.95), 2),
            "running_p50_s": round(statistics.median(r["running"] for r in runs), 2),
            "replay_p95_s": round(
                percentile([r["total"] for r in results if r["kind"] == "replay"], 0.95), 2
            ),
        },
    )
    assert len(runs) == 2 * SESSIONS


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_hundred_runs_in_one_process_keep_memory_and_files_flat(smol):
    args = list(generate_args(max_new_tokens=3, compare=False).values())
    samples = {}
    for n in range(1, 101):
        *_, last = explore.run_explore(*args)  # the final views
        assert Trace.from_dict(last[-4]).totals.new_tokens == 3  # trace_state, then slider, sentence, tree
        if n in (10, 100):
            samples[n] = (rss_mb(), len(os.listdir("/proc/self/fd")), len(list(common.DOWNLOADS.iterdir())))
    (rss10, fds10, _), (rss100, fds100, dl100) = samples[10], samples[100]
    record(
        "soak",
        {
            "runs": 100,
            "rss_mb_at_10": round(rss10),
            "rss_mb_at_100": round(rss100),
            "fds_at_10": fds10,
            "fds_at_100": fds100,
            "download_folders_at_100": dl100,
        },
    )
    assert rss100 - rss10 < 150, "resident memory grew over 90 runs"
    assert fds100 - fds10 <= 3, "open files grew over 90 runs"


def test_old_downloads_are_removed_and_new_ones_stay(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "DOWNLOADS", tmp_path / "downloads")
    old = common.download_folder()
    (old / "speclens-trace.json").write_text("{}")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    new = common.download_folder()
    assert not old.exists() and new.exists()


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (RuntimeError("kernel exploded"), "unexpected error: RuntimeError: kernel exploded"),
        (MemoryError(), "out of memory"),
        (SystemExit(3), "the decoder stopped"),
    ],
    ids=["raises", "oom", "thread-dies"],
)
def test_a_run_that_fails_half_way_frees_its_slot(client, monkeypatch, fault, message):
    real = NGramDraft.propose
    calls = {"n": 0}

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise fault
        return real(self, *args, **kwargs)

    monkeypatch.setattr(NGramDraft, "propose", failing)
    with pytest.raises(Exception, match=message):
        client.predict(**generate_args(), api_name="/generate")
    monkeypatch.setattr(NGramDraft, "propose", real)
    *_, json_path, _, _, _, _ = client.predict(**generate_args(max_new_tokens=4), api_name="/generate")
    assert Trace.load(json_path).totals.new_tokens == 4 and not common._budgets


def test_a_model_that_fails_to_load(client, monkeypatch):

    def broken(*args, **kwargs):
        raise OSError("the disk went away")

    monkeypatch.setattr(api, "load_model", broken)
    with pytest.raises(Exception, match="the disk went away"):
        client.predict(**generate_args(), api_name="/generate")
    monkeypatch.undo()
    *_, json_path, _, _, _, _ = client.predict(**generate_args(max_new_tokens=4), api_name="/generate")
    assert Trace.load(json_path).totals.new_tokens == 4


def test_a_run_whose_page_goes_away_stops_and_frees_the_model(client):
    job = client.submit(
        **generate_args("Count from one to three hundred.", max_new_tokens=400), api_name="/generate"
    )
    deadline = time.monotonic() + 120
    while not job.outputs() and time.monotonic() < deadline:
        time.sleep(0.2)
    job.cancel()
    deadline = time.monotonic() + 30
    while common._budgets and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not common._budgets, "the abandoned run is still running"
    *_, json_path, _, _, _, _ = client.predict(**generate_args(max_new_tokens=4), api_name="/generate")
    assert Trace.load(json_path).totals.new_tokens == 4


@pytest.mark.parametrize(
    "path", ["/etc/passwd", str(ROOT / "decoding" / "models" / "loading.py"), "../../../etc/passwd"]
)
def test_no_file_outside_the_apps_folders_is_served(live_app, path):
    for route in (f"gradio_api/file={path}", f"file={path}"):
        try:
            with urllib.request.urlopen(live_app + route, timeout=10) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            assert exc.code in (403, 404), (route, exc.code)
            continue
        assert b"root:" not in body and b"def load_model" not in body, route


@pytest.mark.parametrize(
    "prompt",
    [
        "tab\tbell\x07 escape\x1b[31m red\x1b[0m, nul-free control characters",
        "emoji 🧪🚀👩🏽‍💻 and flags 🇫🇷",
        "mixed scripts: Ελληνικά, русский, العربية \u202e reversed, 中文, हिन्दी",
    ],
    ids=["control", "emoji", "scripts"],
)
def test_odd_prompts_run_and_come_back_as_typed(client, prompt):
    *_, json_path, _, _, _, _ = client.predict(
        **generate_args(prompt, max_new_tokens=3, compare=False), api_name="/generate"
    )
    trace = Trace.load(json_path)
    assert trace.meta.prompt == prompt and trace.totals.new_tokens == 3


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"k": 16, "max_new_tokens": 3}, None),
        ({"k": 17}, "greater than maximum"),
        ({"k": 0}, "less than minimum"),
        ({"temperature": 2.0, "top_p": 0.05, "top_k": 200, "seed": 2**31, "max_new_tokens": 3}, None),
        ({"temperature": 2.5}, "greater than maximum"),
        ({"top_p": 0.0}, "less than minimum"),
        ({"max_new_tokens": 513}, "greater than maximum"),
        ({"seed": -1, "max_new_tokens": 3}, None),
    ],
)
def test_numeric_fields_at_and_past_their_limits(client, over, message):
    args = generate_args(**{"compare": False, **over})
    if message is None:
        *_, json_path, _, _, _, _ = client.predict(**args, api_name="/generate")
        assert Trace.load(json_path).totals.new_tokens == 3
    else:
        with pytest.raises(Exception, match=message):
            client.predict(**args, api_name="/generate")


@pytest.mark.parametrize(
    "over",
    [
        {"target": "/etc"},
        {"target": "~/.ssh"},
        {"draft_source": "separate draft model", "draft_model": "/root"},
        {"target": "../../etc"},
    ],
)
def test_model_paths_outside_the_allowed_folders_are_refused(client, over):
    with pytest.raises(Exception, match="outside the folders this app loads models from"):
        client.predict(**generate_args(**over), api_name="/generate")


def test_a_model_that_asks_for_remote_code_never_runs_it(client, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    folder = tmp_path / "evil-model"
    folder.mkdir()
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = {
        "model_type": "evil",
        "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("SPECLENS_MODEL_DIRS", str(tmp_path))
    with pytest.raises(Exception, match="cannot read the configuration|cannot load"):
        client.predict(**generate_args(target=str(folder)), api_name="/generate")
    assert not marker.exists(), "remote code ran"


def test_a_trace_file_far_too_large_is_refused_before_it_is_read(client, tmp_path):
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(21_000_000)  # sparse: 21 MB that were never written
    with pytest.raises(Exception, match="over 20 MB"):
        client.predict(handle_file(str(big)), None, api_name="/replay")
