"""The public entry: from names and settings to a finished Trace. The app and the tools call this."""

from __future__ import annotations

import datetime as _dt
import platform
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
import transformers

from .core.batch import BatchRun, BatchSettings, batch_generate, batch_traces
from .core.budget import RunStopped
from .core.graphs import use_batch_graphs, use_graphs
from .core.plain import StopCheck, autoregressive_generate
from .core.proposal import Draft
from .core.speculative import iter_trace, untraced_generate
from .core.tree import MAX_BRANCH, MAX_TREE_NODES, TreeShape
from .drafts import build_draft
from .errors import SpecLensError
from .models.loading import LoadedModel, load_model
from .models.memory import available_bytes
from .models.paths import public_name, public_source
from .models.text import eos_ids, prompt_token_ids, token_texts
from .settings.policies import K_MAX, K_MIN, POLICIES, Policy, make_policy
from .settings.sampling import Sampling
from .trace import Baseline, RunMeta, Trace

MAX_NEW_TOKENS = 2048
MAX_CONTEXT = 4096  # prompt + new tokens, whatever the model allows beyond it


def _opt(default, help: str, **extra):
    """A run setting: its default and the help text its command-line flag shows."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class RunConfig:
    """Every setting of one run. The CLI's flags are made from these fields (see cli.add_run_flags)."""

    target: str = _opt("smollm2-135m", "preset, folder, .gguf file or hub id")
    draft: str = _opt(
        "ngram", "ngram, suffix, layers:N, head, head:PATH or head:ORG/NAME, a model name or path, or none"
    )
    k: int = _opt(4, f"tokens drafted per round ({K_MIN}-{K_MAX}); a tree's depth")
    tree_nodes: int = _opt(
        0, f"draft a token tree of this many nodes, k deep (0: a chain; up to {MAX_TREE_NODES})"
    )
    branch: int = _opt(2, f"a tree's candidates per expansion, and nodes expanded per level (1-{MAX_BRANCH})")
    policy: str = _opt("fixed", "how k changes from round to round", choices=POLICIES)
    confidence: float = _opt(
        0.4,
        "the confidence and entropy policies stop drafting where the draft's predicted acceptance "
        "(its top probability; AdaEDL's entropy bound 1 - sqrt(H)) falls below this",
    )
    sampling: Sampling = field(default_factory=Sampling)
    max_new_tokens: int = _opt(128, f"tokens to generate (1-{MAX_NEW_TOKENS})")
    prompt: str = _opt("", "the text the model continues")
    chat: bool = _opt(True, "apply the tokenizer's chat template when it has one")
    baseline: bool = _opt(False, "also decode plainly and compare")
    device: str | None = _opt(None, "cpu, cuda, cuda:1 (default: best available)")
    dtype: str | None = _opt(None, "float32, bfloat16, float16 (default: by device)")
    compile: bool = _opt(False, "torch.compile the models (slow start, faster rounds)")
    graphs: bool = _opt(
        True, "on a GPU, replay each decode step from a CUDA graph over a static KV cache (docs/gpu.md)"
    )


def encode_prompt(target: LoadedModel, prompt: str, chat: bool) -> torch.Tensor:
    if not prompt or not prompt.strip():
        raise SpecLensError("the prompt is empty: type something for the model to continue")
    return torch.tensor([prompt_token_ids(target.tokenizer, prompt, chat)], device=target.device)


def context_limit(model: torch.nn.Module) -> int:
    cfg = model.config.get_text_config()
    limit = min(MAX_CONTEXT, getattr(cfg, "max_position_embeddings", MAX_CONTEXT) or MAX_CONTEXT)
    # A sliding-window KV cache cannot be rolled back once it is full.
    if getattr(cfg, "sliding_window", None):
        limit = min(limit, cfg.sliding_window)
    return limit


def check_lengths(prompt_len: int, max_new_tokens: int, limit: int) -> None:
    if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise SpecLensError(f"max new tokens must be from 1 to {MAX_NEW_TOKENS}, got {max_new_tokens}")
    if prompt_len + max_new_tokens > limit:
        raise SpecLensError(
            f"the prompt is {prompt_len} tokens; with {max_new_tokens} new tokens that exceeds "
            f"this model's {limit}-token context here. Shorten the prompt or ask for fewer tokens"
        )


def library_versions() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _load_and_encode(config: RunConfig) -> tuple[LoadedModel, torch.Tensor]:
    target = load_model(config.target, config.device, config.dtype, config.compile)
    return target, encode_prompt(target, config.prompt, config.chat)


def fits(config: RunConfig) -> bool:
    """Whether the prompt and the new tokens fit the target's context here."""
    target, prompt_ids = _load_and_encode(config)
    return prompt_ids.shape[1] + config.max_new_tokens <= context_limit(target.model)


def _target_and_prompt(config: RunConfig) -> tuple[LoadedModel, torch.Tensor]:
    target, prompt_ids = _load_and_encode(config)
    check_lengths(prompt_ids.shape[1], config.max_new_tokens, context_limit(target.model))
    return target, prompt_ids


@dataclass
class PreparedRun:
    """One run ready to decode: its models loaded, its prompt encoded and checked."""

    config: RunConfig
    target: LoadedModel
    draft: Draft
    prompt_ids: torch.Tensor
    eos: set[int]
    text: Callable[[int], str]  # a token's text, memoised
    tree: TreeShape | None  # None: chains

    def policy(self) -> Policy:
        """A fresh policy: an adaptive one changes k as the run goes."""
        return make_policy(self.config.policy, self.config.k, self.config.confidence)


def prepare(config: RunConfig, draft: Draft | None = None) -> PreparedRun:
    """Load (once; models are cached) and encode; `draft` reuses one already built."""
    make_policy(config.policy, config.k, config.confidence)  # bad settings fail before any load
    tree = TreeShape(config.tree_nodes, config.branch) if config.tree_nodes else None
    target, prompt_ids = _target_and_prompt(config)
    draft = draft or build_draft(config.draft, target)
    if draft is None:
        raise SpecLensError("a speculative run needs a draft: ngram, layers:N, head or a model name")
    if tree is not None and not draft.drafts_trees:
        raise SpecLensError(f"a {draft.kind} draft cannot draft a token tree yet: set tree nodes to 0")
    # Captured here, before anything is timed; inside the GPU call on ZeroGPU (docs/gpu.md).
    k = config.k if config.policy == "fixed" else K_MAX
    use_graphs(target.model, draft, prompt_ids.shape[1] + config.max_new_tokens, k, tree, config.graphs)
    text = token_texts(target.tokenizer)
    return PreparedRun(config, target, draft, prompt_ids, eos_ids(target.model, target.tokenizer), text, tree)


def iter_speculative(run: PreparedRun, should_stop: StopCheck | None = None) -> Iterator[Trace]:
    """The traced run, growing round by round (see `speculative.iter_trace`); the
    last one is finished, its output text set."""
    c, policy = run.config, run.policy()
    for trace in iter_trace(
        run.target.model,
        run.prompt_ids,
        run.draft,
        policy,
        c.sampling,
        c.max_new_tokens,
        run.eos,
        run.text,
        run_meta(run, policy),
        should_stop,
        run.tree,
    ):
        yield trace
    trace.output.text = run.target.tokenizer.decode(trace.output.token_ids, skip_special_tokens=True)


def speculative(run: PreparedRun) -> Trace:
    """The traced run to its end."""
    for trace in iter_speculative(run):  # noqa: B007 - the last one is the finished trace
        pass
    return trace


def untraced(run: PreparedRun) -> Trace:
    """The same rounds, recording only the totals (what tracing costs, in the benchmark)."""
    c = run.config
    return untraced_generate(
        run.target.model,
        run.prompt_ids,
        run.draft,
        run.policy(),
        c.sampling,
        c.max_new_tokens,
        run.eos,
        run.tree,
    )


def iter_generate(
    config: RunConfig, should_stop: StopCheck | None = None, draft: Draft | None = None
) -> Iterator[Trace]:
    """Load (once), then decode speculatively: the trace after each round, and
    the finished one last (output text set, compared with plain decoding when
    `config.baseline` asks and the run was not stopped). Every one-time cost is
    paid before the run is measured (`warm_up`). `draft`, when given,
    drafts instead of the one `config.draft` names (the app's per-session suffix corpus).

    A run that `should_stop` ends early keeps its rounds and says why in
    `meta.stopped`.
    """
    run = prepare(config, draft)
    warm_up(run)
    for trace in iter_speculative(run, should_stop):
        yield trace
    if config.baseline and not trace.meta.stopped:
        compare_with_plain(trace, config, should_stop)
    yield trace


def generate(config: RunConfig, should_stop: StopCheck | None = None) -> Trace:
    """`iter_generate` to the end: the finished trace."""
    for trace in iter_generate(config, should_stop):  # noqa: B007 - the last one is the finished trace
        pass
    return trace


def compare_with_plain(trace: Trace, config: RunConfig, should_stop: StopCheck | None = None) -> None:
    """Attach the plain run of the same prompt; a stopped one leaves the trace saying so."""
    try:
        trace.attach_baseline(plain_baseline(config, should_stop))
    except RunStopped as stop:
        trace.meta.stopped = f"{stop} while decoding plainly to compare"


def plain_baseline(config: RunConfig, should_stop: StopCheck | None = None) -> Baseline:
    """Decode `config.prompt` with the target alone: the reference for speed and output.

    Raises RunStopped when `should_stop` ends it: half a reference compares with nothing.
    """
    target, prompt_ids = _target_and_prompt(config)
    warm_plain(target, prompt_ids, config.sampling)
    plain = autoregressive_generate(
        target.model,
        prompt_ids,
        config.sampling,
        config.max_new_tokens,
        eos_ids(target.model, target.tokenizer),
        should_stop,
    )
    if plain.stopped:
        raise RunStopped(plain.stopped)
    text = target.tokenizer.decode(plain.token_ids, skip_special_tokens=True)
    tps = len(plain.token_ids) / plain.wall_s
    texts = [token_texts(target.tokenizer)(t) for t in plain.token_ids]
    return Baseline(text, plain.token_ids, plain.wall_s, tps, plain.token_times_s, texts)


# What each loaded model has already run once: ("plain", greedy) for plain decoding, and
# (draft spec, tree, greedy) for a kind of speculative run. A model loaded again starts afresh.
_WARM: weakref.WeakKeyDictionary[torch.nn.Module, set[tuple]] = weakref.WeakKeyDictionary()
_warm_lock = threading.Lock()
WARM_UP_TOKENS = 4  # plain decoding's: its first steps after the prefill


def _first_time(model: torch.nn.Module, key: tuple) -> bool:
    """Whether `model` has not yet run `key`'s kind of run; marks it as run."""
    with _warm_lock:
        done = _WARM.setdefault(model, set())
        first = key not in done
        done.add(key)
    return first


def warm_plain(target: LoadedModel, prompt_ids: torch.Tensor, sampling: Sampling) -> None:
    """Decode a few tokens plainly, once per model and kind of sampling, so that a measured plain run
    pays none of the target's first calls (the row kernel packs its panels, buffers are allocated)."""
    if _first_time(target.model, ("plain", sampling.greedy)):
        autoregressive_generate(target.model, prompt_ids, sampling, WARM_UP_TOKENS)


def warm_up(run: PreparedRun) -> None:
    """Pay every one-time cost of this kind of run before one is measured: plain decoding's
    (`warm_plain`), then a short speculative run, once per target, draft source, chain or tree and
    kind of sampling: the draft's first calls, the target's first k-token checks, the first rounds
    recorded. Otherwise the first run after start-up carries them, and a comparison with the plain
    run made after it measures them instead of decoding. Suffix decoding's corpus is left as it was."""
    c = run.config
    warm_plain(run.target, run.prompt_ids, c.sampling)
    if not _first_time(run.target.model, (c.draft, run.tree is not None, c.sampling.greedy)):
        return
    short = replace(run, config=replace(c, max_new_tokens=min(c.max_new_tokens, 2 * (c.k + 1))))
    with run.draft.leaving_no_memory():
        speculative(short)


def run_meta(run: PreparedRun, policy: Policy) -> RunMeta:
    c, target = run.config, run.target
    prompt_ids = run.prompt_ids[0].tolist()
    return RunMeta(
        # Names, never local paths: a trace is made to be shared.
        target=public_name(c.target),
        target_source=public_source(c.target, target.source),
        draft_kind=run.draft.kind,
        draft=run.draft.name,
        device=str(target.device),
        dtype=str(target.dtype).removeprefix("torch."),
        compiled=target.compiled,
        row_kernel=target.row_kernel,
        packed_output_layer=target.packed,
        policy=replace(policy),
        sampling=c.sampling,
        max_new_tokens=c.max_new_tokens,
        prompt=c.prompt,
        chat_template=c.chat and bool(getattr(target.tokenizer, "chat_template", None)),
        prompt_tokens=len(prompt_ids),
        prompt_token_texts=[run.text(t) for t in prompt_ids],
        tree_nodes=c.tree_nodes,
        branch=c.branch if c.tree_nodes else 0,
        versions=library_versions(),
        started=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )


@dataclass
class PreparedBatch:
    """A prompt set ready to decode in batches: the target and draft loaded, every prompt encoded."""

    config: RunConfig
    target: LoadedModel
    draft: Draft
    prompt_ids: list[torch.Tensor]
    eos: set[int]
    prompts: list[str]


def prepare_batch(config: RunConfig, prompts: Sequence[str], sizes: Sequence[int]) -> PreparedBatch:
    """Load and encode for batched runs of `sizes` sequences at once; a size the prompt set or the
    memory for the batch's caches cannot hold is refused in one line."""
    if not prompts:
        raise SpecLensError("a batched run needs prompts")
    for size in sizes:
        if not isinstance(size, int) or size < 1:
            raise SpecLensError(f"a batch holds at least 1 sequence, got {size}")
        if size > len(prompts):
            raise SpecLensError(
                f"a batch of {size} needs at least {size} prompts; the set has {len(prompts)}"
            )
    make_policy(config.policy, config.k, config.confidence)
    target = load_model(config.target, config.device, config.dtype, config.compile)
    ids = [encode_prompt(target, p, config.chat) for p in prompts]
    limit = context_limit(target.model)
    for i in ids:
        check_lengths(i.shape[1], config.max_new_tokens, limit)
    _check_batch_memory(target, max(sizes), max(i.shape[1] for i in ids) + config.max_new_tokens)
    draft = build_draft(config.draft, target)
    if draft is None:
        raise SpecLensError("a speculative run needs a draft: ngram, layers:N, head or a model name")
    if config.tree_nodes and not draft.drafts_trees:
        raise SpecLensError(f"a {draft.kind} draft cannot draft a token tree yet: set tree nodes to 0")
    return PreparedBatch(config, target, draft, ids, eos_ids(target.model, target.tokenizer), list(prompts))


def _check_batch_memory(target: LoadedModel, size: int, tokens: int) -> None:
    """Each sequence's KV cache, at twice its longest length (a cache grows by doubling), must fit."""
    cfg = target.model.config.get_text_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * target.model.dtype.itemsize
    need, free = size * 2 * tokens * per_token, available_bytes(target.device)
    if need > free:
        raise SpecLensError(
            f"a batch of {size} needs about {need / 2**30:.1f} GiB for its caches; "
            f"{free / 2**30:.1f} GiB is free here. Use a smaller batch or fewer new tokens"
        )


def decode_batch(
    batch: PreparedBatch, size: int, speculative: bool, should_stop: StopCheck | None = None
) -> BatchRun:
    """Every prompt, `size` at a time (continuous batching): plainly, or speculatively with the
    config's draft and policy. Raises RunStopped when `should_stop` ends it."""
    c = batch.config
    tree = TreeShape(c.tree_nodes, c.branch) if c.tree_nodes else None
    settings = BatchSettings(size, c.sampling, c.max_new_tokens, batch.eos, tree)
    policy = (lambda: make_policy(c.policy, c.k, c.confidence)) if speculative else None
    length = max(i.shape[1] for i in batch.prompt_ids) + c.max_new_tokens
    use_batch_graphs(batch.target.model, size, length, c.k if speculative else 0, tree, c.graphs)
    return batch_generate(
        batch.target.model, batch.prompt_ids, settings, batch.draft if speculative else None, policy
    )


def batch_run_traces(batch: PreparedBatch, run: BatchRun) -> list[Trace]:
    """A speculative batched run's sequences, each as a Trace (Replay reads them as any trace)."""
    c, text = batch.config, token_texts(batch.target.tokenizer)
    policy = make_policy(c.policy, c.k, c.confidence)
    tree = TreeShape(c.tree_nodes, c.branch) if c.tree_nodes else None
    metas = [
        run_meta(
            PreparedRun(replace(c, prompt=prompt), batch.target, batch.draft, ids, batch.eos, text, tree),
            policy,
        )
        for prompt, ids in zip(batch.prompts, batch.prompt_ids, strict=True)
    ]
    traces = batch_traces(run, metas, text)
    for trace in traces:
        trace.output.text = batch.target.tokenizer.decode(trace.output.token_ids, skip_special_tokens=True)
    return traces
