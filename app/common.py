"""What every tab's handlers share: a session's time budget and its Stop, a user's mistake as one
message, the sidebar's settings read into a `RunConfig`, inputs passed by name, and downloads.

Every handler turns a user's mistake into a `gr.Error` with a plain message; the worker keeps
serving.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import shutil
import tempfile
import threading
import time
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import gradio as gr

from decoding.api import RunConfig
from decoding.core.budget import RunBudget
from decoding.drafts import HYBRID_HEAD_K
from decoding.errors import SpecLensError
from decoding.models.loading import layer_count
from decoding.models.paths import check_allowed
from decoding.models.presets import PRESETS, params_of
from decoding.settings.environment import on_zerogpu
from decoding.settings.sampling import Sampling
from decoding.trace import Round, Trace, token_frame
from visualize.cards import recorded_note
from visualize.tree import tree_figure

log = logging.getLogger("speclens")

ASSETS = Path(__file__).resolve().parents[1] / "assets"
MAX_PROMPT_CHARS = 50_000  # beyond this no model here has the context anyway
DOWNLOADS = Path(tempfile.gettempdir()) / "speclens-downloads"
DOWNLOAD_MAX_AGE_S = 3600
# Decoding time a request may take, counted from its first round (loading excluded),
# for everything it runs: the speculative run, the comparison, every k of a sweep.
TIME_LIMIT_S = float(os.environ.get("SPECLENS_TIME_LIMIT_S", "180"))
DRAFT_SOURCES = {
    "n-gram (prompt lookup)": "ngram",
    "trained draft head (EAGLE-3)": "head",
    # The head's rounds are capped: the label says so, as k would say otherwise.
    f"n-gram where the text repeats, else the head ({HYBRID_HEAD_K} tokens at most a chain round)": "ngram+head",
    "suffix decoding (this prompt and this session's runs)": "suffix",
    "first N layers of the target": "layers",
    "separate draft model": "model",
}
HEAD_KINDS = ("head", "ngram+head")  # the draft sources whose head the model box may name
MODEL_BOX_LABEL = "Draft model (another tokenizer drafts through text)"
HEAD_BOX_LABEL = "Head: a hub id or folder (empty: the head SpecLens ships for the target)"
# The sidebar's settings, named as RunConfig and Sampling name them (the draft is three controls:
# its source, N for a layer draft, the model for a separate one). The page builds its controls
# under these names and the handlers read them by these names.
SETTINGS = (
    *("target", "draft_source", "n_layers", "draft_model", "k", "tree_nodes", "branch", "policy"),
    *("confidence", "temperature", "top_k", "top_p", "seed", "max_new_tokens"),
)


try:  # Hugging Face Spaces install it (requirements-dev.txt pins it here); the app runs without it.
    import spaces
except ImportError:
    spaces = None

# What a ZeroGPU call is granted besides decoding: loading its models from the Space's disk, and
# capturing their CUDA graphs (docs/gpu.md). Allowances, not measurements: a call that runs
# past its duration is cut off, and a shorter one waits less in ZeroGPU's queue.
LOAD_S, LOAD_S_PER_BILLION = 10.0, 6.0
CAPTURE_S = 10.0
TOKEN_S, TOKEN_S_PER_BILLION = 0.02, 0.01  # a decoded token, eager steps at worst
PROBE_S = 60.0  # Theory's V(n): the target over 1 to 64 tokens
UNKNOWN_PARAMS = 8.5e9  # a model SpecLens cannot size before loading: the largest GPU pair's


def gpu(fn: Callable) -> Callable:
    """A model-bound handler. On ZeroGPU each call asks for a GPU for as long as its own request needs
    (`gpu_seconds` of the handler's arguments, by name), and captures the CUDA graphs it replays
    inside that call; elsewhere `spaces.GPU` (or its absence) leaves the handler as it is."""
    signature = inspect.signature(fn)

    def duration(*args, **kwargs) -> int:
        try:
            values = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:  # not the handler's arguments: the longest a request may take
            values = {}
        return gpu_seconds(values)

    fn.gpu_duration = duration  # what `spaces` calls with the handler's arguments
    return fn if spaces is None else spaces.GPU(fn, duration=duration)


def gpu_seconds(values: Mapping[str, Any]) -> int:
    """A GPU call's duration for a request's settings: loading its pair, capturing its graphs, and
    decoding the tokens it asks for (twice when compared with plain decoding) at an allowance per
    token that grows with the pair; a sweep, whose runs the time budget bounds, gets the budget."""
    billions = _pair_params(values) / 1e9
    if "max_new_tokens" in values and "k_from" not in values:
        runs = 2 if values.get("compare") else 1
        per_token = TOKEN_S + TOKEN_S_PER_BILLION * billions
        decode = min(TIME_LIMIT_S, runs * int(values["max_new_tokens"]) * per_token)
    else:
        decode = PROBE_S if "k_from" not in values else TIME_LIMIT_S
    return int(LOAD_S + LOAD_S_PER_BILLION * billions + CAPTURE_S + decode)


def _pair_params(values: Mapping[str, Any]) -> float:
    target = (values.get("target") or "").strip()
    try:
        draft = draft_spec(values["draft_source"], values["n_layers"], values["draft_model"] or "")
    except (KeyError, SpecLensError):  # a probe's target alone, or no draft named yet
        draft = "none"
    sizes = [params_of(target), params_of(draft)]
    return sum(UNKNOWN_PARAMS if size is None else size for size in sizes)


def outside_gpu_call(config: RunConfig) -> RunConfig:
    """Settings for a check made outside a GPU call: on ZeroGPU, no CUDA graphs (CUDA must not start
    in the main process, and a call's graphs end with it: the run captures its own, inside its call)."""
    return replace(config, graphs=False) if on_zerogpu() else config


_budgets: dict[str, RunBudget] = {}  # the running model-bound request of each browser session


@contextlib.contextmanager
def session_budget(request: gr.Request | None) -> Iterator[RunBudget]:
    """A fresh budget for this session's request, findable by `request_stop` while it runs."""
    key = getattr(request, "session_hash", None) or f"anonymous-{threading.get_ident()}"
    budget = RunBudget(TIME_LIMIT_S)
    _budgets[key] = budget
    try:
        yield budget
    finally:
        if _budgets.get(key) is budget:
            del _budgets[key]


def request_stop(request: gr.Request) -> None:
    """Stop button: this session's run ends at its next round and shows what it has."""
    budget = _budgets.get(request.session_hash)
    if budget is not None:
        budget.stop()


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Our own errors as they are; anything else as one line, logged in full here."""
    try:
        yield
    except gr.Error:
        raise
    except SpecLensError as exc:
        raise gr.Error(str(exc)) from None
    except MemoryError:
        raise gr.Error("out of memory: pick a smaller model or fewer tokens") from None
    except SystemExit as exc:  # a library called exit() mid-run: this request ends, the server stays up
        log.error("the decoder raised SystemExit(%s)", exc.code)
        raise gr.Error(f"the decoder stopped ({type(exc).__name__}); run it again") from None
    except Exception as exc:
        if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError
            raise gr.Error("the GPU ran out of memory: pick a smaller model or fewer tokens") from None
        log.exception("unexpected error")
        raise gr.Error(f"unexpected error: {type(exc).__name__}: {exc}") from None


def draft_spec(source: str, n_layers: float, draft_model: str) -> str:
    """The draft spec the sidebar's source, N and draft model box make (`build_draft`'s words)."""
    kind = DRAFT_SOURCES.get(source)
    if kind is None:
        raise SpecLensError(f"unknown draft source '{source}'")
    if kind == "layers":
        return f"layers:{int(n_layers)}"
    name = (draft_model or "").strip()
    if kind == "model":
        if not name:
            raise SpecLensError("choose a draft model: a preset, a folder or a hub id of a smaller model")
        check_allowed(name)
        return name
    # A head by hub id or folder; none named, the one SpecLens ships. A preset names a model, never
    # a head: one left in the box from a model draft is not read as one.
    if kind in HEAD_KINDS and name and name not in PRESETS:
        check_allowed(name)
        return f"{kind}:{name}"
    return kind


def spec_controls(spec: str) -> tuple[str, int | None, str | None]:
    """The draft source, N and draft model that `draft_spec` turns into `spec` (None: not named)."""
    kind, _, rest = spec.partition(":")
    sources = {name: label for label, name in DRAFT_SOURCES.items()}
    if kind == "layers":
        return sources["layers"], int(rest), None
    if kind in HEAD_KINDS and rest:
        return sources[kind], None, rest
    if spec in sources and spec not in ("layers", "model"):
        return sources[spec], None, None
    return sources["model"], None, spec


def layer_range(target: str, n_layers: float):
    """Bind the N slider to the target's own layer count (N must leave at least one layer out)."""
    try:
        check_allowed(target)
    except SpecLensError:  # the run will say why; the slider stays as it is
        return gr.update()
    total = layer_count(target)
    if not total or total < 2:
        return gr.update()
    return gr.update(maximum=total - 1, value=min(int(n_layers), total - 1))


def model_box(source: str) -> dict:
    """The model box for a draft source: a separate draft model's name, or the head's hub id or
    folder for the head drafts; hidden for the others."""
    kind = DRAFT_SOURCES.get(source)
    if kind in HEAD_KINDS:
        return {"visible": True, "label": HEAD_BOX_LABEL}
    return {"visible": kind == "model", "label": MODEL_BOX_LABEL}


def draft_controls(source: str, draft_model: str | None):
    """Show N only for the layer draft, and the model box as `model_box` says; a model's name left
    in it does not name a head, so it goes when a head draft is chosen."""
    stale = DRAFT_SOURCES.get(source) in HEAD_KINDS and (draft_model or "").strip() in PRESETS
    box = gr.update(**model_box(source), **({"value": None} if stale else {}))
    return gr.update(visible=DRAFT_SOURCES.get(source) == "layers"), box


def make_config(settings: Mapping[str, Any]) -> RunConfig:
    """A run's settings, from the page's controls named as `SETTINGS` (and the prompt)."""
    prompt = settings.get("prompt") or ""
    if not prompt.strip():
        raise SpecLensError("the prompt is empty: type something for the model to continue")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise SpecLensError(f"the prompt is over {MAX_PROMPT_CHARS:,} characters; shorten it")
    target = (settings["target"] or "").strip()
    check_allowed(target)
    return RunConfig(
        target=target,
        draft=draft_spec(settings["draft_source"], settings["n_layers"], settings["draft_model"]),
        k=int(settings["k"]),
        tree_nodes=int(settings["tree_nodes"]),
        branch=int(settings["branch"]),
        policy=settings["policy"],
        confidence=float(settings["confidence"]),
        sampling=Sampling(
            float(settings["temperature"]),
            int(settings["top_k"]),
            float(settings["top_p"]),
            int(settings["seed"]),
        ),
        max_new_tokens=int(settings["max_new_tokens"]),
        prompt=prompt,
    )


def by_name(names: tuple[str, ...]) -> Callable:
    """Gradio hands a handler its inputs one by one; the decorated function takes them as one
    mapping by name. The wrapper's signature lists the names, so Gradio's API (and gradio_client)
    names each input as the page does."""

    def wrap(fn: Callable) -> Callable:
        extra = list(inspect.signature(fn).parameters.values())[1:]  # request, progress
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        signature = inspect.Signature([inspect.Parameter(n, positional) for n in names] + extra)

        def split(args: tuple, kwargs: dict) -> tuple[dict, dict]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = bound.arguments
            return {n: values[n] for n in names}, {p.name: values[p.name] for p in extra}

        if inspect.isgeneratorfunction(fn):

            def handler(*args, **kwargs):
                settings, rest = split(args, kwargs)
                yield from fn(settings, **rest)
        else:

            def handler(*args, **kwargs):
                settings, rest = split(args, kwargs)
                return fn(settings, **rest)

        handler.__name__, handler.__doc__ = fn.__name__, fn.__doc__
        handler.__signature__ = signature
        # Gradio finds the request and progress parameters by their types.
        hints = typing.get_type_hints(fn)
        handler.__annotations__ = {p.name: hints[p.name] for p in extra if p.name in hints}
        return handler

    return wrap


def download_folder() -> Path:
    """A fresh folder for one request's downloads; those older than DOWNLOAD_MAX_AGE_S go first,
    so a server that runs for days does not pile them up (Gradio cleans its own copies)."""
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in DOWNLOADS.iterdir():
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > DOWNLOAD_MAX_AGE_S:
                shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(dir=DOWNLOADS))


def save_downloads(trace: Trace) -> tuple[str, str]:
    folder = download_folder()
    json_path, csv_path = folder / "speclens-trace.json", folder / "speclens-tokens.csv"
    trace.save(json_path)
    token_frame(trace).to_csv(csv_path, index=False)
    return str(json_path), str(csv_path)


def tree_view(rnd: Round | None, index: int = 0):
    """A tree round's tree; a chain round has none, so the figure is hidden."""
    if rnd is None or not rnd.tree:
        return gr.update(value=None, visible=False)
    return gr.update(value=tree_figure(rnd, index), visible=True)


def round_slider(rounds: int):
    """A slider over the rounds of a run; Gradio needs two values, so one round leaves it fixed."""
    return gr.update(maximum=max(2, rounds), value=1, interactive=rounds > 1)


@functools.cache
def example_traces() -> dict[str, str]:
    return {p.stem: str(p) for p in sorted((ASSETS / "traces").glob("*.json"))}


EXAMPLE_MACHINE = "a 2-core CPU"  # where the example traces were recorded (assets/traces/README.md)


def example_recorded(trace: Trace, name: str) -> str:
    """What the cards of example trace `name` say it is: recorded on another machine, and when."""
    return recorded_note(trace, f"the example assets/traces/{name}.json", EXAMPLE_MACHINE)
