"""The Trace: one run of the decoder, every proposal and every verdict.

Pure Python (plus pandas for the flat view) so that `visualize/` and a
classroom laptop can load and chart a saved trace without torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import SpecLensError, TraceError
from .policies import Policy
from .sampling import Sampling

TOKEN_KINDS = ("prompt", "accepted", "rejected", "discarded", "correction", "bonus")
# 1: verdicts without `kind`, discarded tokens carried numbers. 2: kinds, top-5 lists, n-gram matches.
# 3: "rounds" (not "steps"), `round_ms`, totals with `rounds` and `tokens_per_round`.
TRACE_VERSION = 3


@dataclass
class DraftToken:
    id: int
    text: str
    q: float  # the draft's probability of this token; 1.0 for a deterministic draft


@dataclass
class Verdict:
    """The target's judgement of one draft position.

    Only the accepted prefix and the first refused token were judged. The
    target scored the tokens after that one following a prefix it had
    refused, so for a `discarded` token p, accept_prob and u are None.
    """

    p: float | None  # the target's probability of the drafted token
    accept_prob: float | None  # min(1, p/q) when sampling; 1 or 0 when greedy
    u: float | None  # the uniform draw; None when greedy
    accepted: bool
    kind: str = ""  # accepted, rejected or discarded; filled from the position when empty


@dataclass
class Emitted:
    id: int
    text: str
    kind: str  # "correction" or "bonus"
    p: float  # the target's probability of this token


@dataclass
class TopToken:
    id: int
    text: str
    prob: float


@dataclass
class Match:
    """Where an n-gram draft copied its proposal from, in token positions of the sequence."""

    start: int  # the first copied token; the matched n-gram ends just before it
    ngram: int  # how many tokens matched


@dataclass
class TreeNode:
    """One token of a round's draft tree, listed parents first."""

    id: int
    text: str
    q: float  # the draft's probability of this token after its parent's path
    parent: int  # the parent's index in the round's list; -1: a child of the last verified token
    depth: int  # 1 for the children of the last verified token
    p: float | None  # the target's probability of it; None when the target never tried it
    accepted: bool  # on the accepted path


@dataclass
class Translation:
    """A draft with another tokenizer: what it wrote this round in its own tokens, and
    which of them each drafted target token came from."""

    ids: list[int]  # the draft's tokens, in its own vocabulary
    texts: list[str]  # each one's text
    sources: list[list[int]]  # per drafted target token: indices into `ids`
    # "text": the draft's text re-encoded for the target (greedy); "vocab": a token with
    # the same text in both vocabularies, one for one (sampling).
    mode: str = "text"

    def cut(self, n: int) -> Translation:
        """Only the first `n` target tokens were kept (cut after an end of text)."""
        return Translation(self.ids, self.texts, self.sources[:n], self.mode)


@dataclass
class Round:
    k: int
    draft: list[DraftToken]
    verdicts: list[Verdict]
    n_accepted: int
    # None only when the round's last accepted draft token ended the text (EOS).
    emitted: Emitted | None
    draft_ms: float
    verify_ms: float
    round_ms: float  # the whole round: drafting, checking and recording it
    # What a reader wants where the round turned: the distributions at the
    # position of the emitted token (the first refused draft position, or the
    # bonus position). None when not recorded (simulations, version-1 traces).
    target_top: list[TopToken] | None = None
    draft_top: list[TopToken] | None = None  # the draft's, when it has a distribution there
    residual_top: list[TopToken] | None = None  # sampling: max(0, p - q) normalised, drawn from
    match: Match | None = None  # n-gram drafts: where the proposal was copied from
    # A tree round: every node it drafted. Then `draft` and `verdicts` are its main
    # line (the accepted path, then the best child refused after it). None: a chain.
    tree: list[TreeNode] | None = None
    translation: Translation | None = None  # a draft with another tokenizer

    def __post_init__(self) -> None:
        for j, v in enumerate(self.verdicts):
            if not v.kind:
                v.kind = verdict_kind(j, self.n_accepted)
                if v.kind == "discarded":  # a version-1 trace: its numbers meant nothing
                    v.p = v.accept_prob = v.u = None

    @property
    def new_tokens(self) -> int:
        return self.n_accepted + (self.emitted is not None)

    @property
    def checked(self) -> int:
        """Tokens the target's pass read: the last verified one and every drafted one."""
        return 1 + (len(self.tree) if self.tree is not None else self.k)


def verdict_kind(position: int, n_accepted: int) -> str:
    if position < n_accepted:
        return "accepted"
    return "rejected" if position == n_accepted else "discarded"


@dataclass
class Output:
    text: str
    token_ids: list[int]


@dataclass
class Baseline:
    text: str
    token_ids: list[int]
    wall_s: float
    tokens_per_s: float
    token_times_s: list[float] = field(default_factory=list)  # when each token was ready


@dataclass
class Totals:
    """A run's figures, all computed here from its rounds and its decoding time."""

    rounds: int = 0
    new_tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0  # accepted / proposed
    tokens_per_round: float = 0.0
    wall_s: float = 0.0  # decoding time, prefill included; loading and drawing are not
    tokens_per_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_ms: float = 0.0
    # Set when the run is compared with plain decoding of the same prompt.
    baseline_tokens_per_s: float | None = None
    speedup: float | None = None
    identical_to_baseline: bool | None = None

    @classmethod
    def of_counts(
        cls, rounds: int, new_tokens: int, proposed: int, accepted: int, wall_s: float, **times: float
    ) -> Totals:
        return cls(
            rounds=rounds,
            new_tokens=new_tokens,
            proposed=proposed,
            accepted=accepted,
            acceptance_rate=accepted / proposed if proposed else 0.0,
            tokens_per_round=new_tokens / rounds if rounds else 0.0,
            wall_s=wall_s,
            tokens_per_s=new_tokens / wall_s if wall_s > 0 else 0.0,
            **times,
        )

    @classmethod
    def of_rounds(cls, rounds: list[Round], wall_s: float) -> Totals:
        """Whatever the rounds did not time (the prefill, mostly) is the prefill."""
        return cls.of_counts(
            len(rounds),
            sum(r.new_tokens for r in rounds),
            sum(r.k for r in rounds),
            sum(r.n_accepted for r in rounds),
            wall_s,
            draft_s=sum(r.draft_ms for r in rounds) / 1e3,
            verify_s=sum(r.verify_ms for r in rounds) / 1e3,
            prefill_ms=max(0.0, wall_s * 1e3 - sum(r.round_ms for r in rounds)),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Totals:
        """Checked field by field; fields this version does not know are left out."""
        known = {f.name for f in fields(cls)}
        data = {key: value for key, value in data.items() if key in known}
        for key, value in data.items():
            ok = isinstance(value, bool) if key == "identical_to_baseline" else _is_num(value)
            if not (ok or (value is None and key in OPTIONAL_TOTALS)):
                raise TraceError(f"totals.{key} must be a number, got {value!r}")
        return cls(**data)


OPTIONAL_TOTALS = ("baseline_tokens_per_s", "speedup", "identical_to_baseline")


@dataclass
class RunMeta:
    """What was run, on what, with which settings; names, never local paths (a trace is shared)."""

    target: str = ""
    target_source: str = ""  # the hub id (plus the GGUF file of an offline preset)
    draft_kind: str = ""  # ngram, layers, head, model, or cross (a model with another tokenizer)
    draft: str = ""
    device: str = ""
    dtype: str = ""
    compiled: bool = False
    row_kernel: bool = False  # linear layers through SpecLens's kernel (decoding/rowlinear.py)
    packed_output_layer: bool = False
    policy: Policy = field(default_factory=lambda: Policy("fixed", 0))  # as it was at the start
    sampling: Sampling = field(default_factory=Sampling)
    max_new_tokens: int = 0
    prompt: str = ""
    chat_template: bool = False
    prompt_tokens: int = 0
    # What the target saw, chat template included, token by token: the
    # timeline shows it and marks where an n-gram draft copied from.
    prompt_token_texts: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    tree_nodes: int = 0  # token trees of this many nodes, policy.k deep; 0: chains
    branch: int = 0  # a tree's candidates per expansion
    started: str = ""  # ISO time, UTC
    stopped: str | None = None  # why the run ended before its end, when it did

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sampling"]["greedy"] = self.sampling.greedy  # for a reader of the JSON
        return data

    @classmethod
    def from_dict(cls, data: Any) -> RunMeta:
        """Checked field by field; unknown fields are left out and nulls read as unset."""
        if not isinstance(data, dict):
            raise TraceError("meta must be an object")
        known = {f.name for f in fields(cls)}
        data = {key: value for key, value in data.items() if key in known and value is not None}
        problem = _meta_problem(data)
        if problem:
            raise TraceError(problem)
        try:
            return cls(
                **data | {"policy": _policy(data.get("policy")), "sampling": _sampling(data.get("sampling"))}
            )
        except SpecLensError as exc:
            raise TraceError(f"meta: {exc}") from None


def _policy(data: dict | None) -> Policy:
    data = data or {}
    return Policy(data.get("name", "fixed"), data.get("k", 0), data.get("min_confidence"))


def _sampling(data: dict | None) -> Sampling:
    data = dict(data or {})
    greedy = data.pop("greedy", True)
    if "temperature" not in data and not greedy:  # a hand-made trace that said only "sampled"
        data["temperature"] = 1.0
    return Sampling(**{key: value for key, value in data.items() if key in _SAMPLING_FIELDS})


_SAMPLING_FIELDS = {f.name for f in fields(Sampling)}


@dataclass
class Trace:
    meta: RunMeta = field(default_factory=RunMeta)
    rounds: list[Round] = field(default_factory=list)
    totals: Totals = field(default_factory=Totals)
    output: Output = field(default_factory=lambda: Output("", []))
    baseline: Baseline | None = None
    version: int = TRACE_VERSION

    # -- derived views -------------------------------------------------------

    def emitted_ids(self) -> list[int]:
        """The output token ids, rebuilt from the rounds (accepted, then emitted)."""
        ids: list[int] = []
        for r in self.rounds:
            ids.extend(t.id for t in r.draft[: r.n_accepted])
            if r.emitted is not None:
                ids.append(r.emitted.id)
        return ids

    def token_times_s(self) -> list[float]:
        """When each output token was ready, in seconds from the start (prefill included)."""
        t = self.totals.prefill_ms / 1e3
        times: list[float] = []
        for r in self.rounds:
            t += r.round_ms / 1e3
            times.extend([t] * r.new_tokens)
        return times

    def finish(self, wall_s: float) -> Totals:
        """Set the totals from the rounds and the run's decoding time."""
        self.totals = Totals.of_rounds(self.rounds, wall_s)
        return self.totals

    def attach_baseline(self, baseline: Baseline) -> None:
        self.baseline = baseline
        t = self.totals
        t.baseline_tokens_per_s = baseline.tokens_per_s
        t.speedup = t.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else 0.0
        t.identical_to_baseline = baseline.token_ids == self.output.token_ids

    # -- serialisation -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"meta": self.meta.to_dict()}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(indent=1), encoding="utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trace:
        """Build a trace from its JSON form; older versions are migrated on the way."""
        try:
            version = data.get("version", 1)
            if not isinstance(version, int) or not 1 <= version <= TRACE_VERSION:
                raise TraceError(f"not a SpecLens trace: unknown version {version!r}")
            if version < 3:
                data = _rounds_not_steps(data)
            baseline = data.get("baseline")
            rounds = [_round_from_dict(r) for r in data["rounds"]]
            totals = data.get("totals")
            return cls(
                meta=RunMeta.from_dict(data["meta"]),
                rounds=rounds,
                totals=Totals.from_dict(totals) if totals else Totals.of_rounds(rounds, 0.0),
                output=Output(**data["output"]),
                baseline=Baseline(**baseline) if baseline else None,
            )
        except TraceError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TraceError(f"not a SpecLens trace: missing or malformed field {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> Trace:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise TraceError(f"not a SpecLens trace: invalid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise TraceError("not a SpecLens trace: the top level must be an object")
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))

    def to_dataframe(self):  # -> pandas.DataFrame
        """One row per token event, in timeline order (see `token_events`)."""
        import pandas as pd

        return pd.DataFrame(token_events(self), columns=EVENT_COLUMNS)


def _rounds_not_steps(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 or 2 trace in today's words: its steps were rounds."""

    def renamed(d: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
        return {names.get(key, key): value for key, value in d.items()}

    data = dict(data)
    data["rounds"] = [renamed(r, {"step_ms": "round_ms"}) for r in data.pop("steps")]
    data["totals"] = renamed(
        data.get("totals") or {}, {"steps": "rounds", "tokens_per_step": "tokens_per_round"}
    )
    return data


def _tops(rows: list[dict] | None) -> list[TopToken] | None:
    return None if rows is None else [TopToken(**r) for r in rows]


def _round_from_dict(s: dict[str, Any]) -> Round:
    emitted, match = s.get("emitted"), s.get("match")
    return Round(
        k=s["k"],
        draft=[DraftToken(**t) for t in s["draft"]],
        verdicts=[Verdict(**v) for v in s["verdicts"]],
        n_accepted=s["n_accepted"],
        emitted=Emitted(**emitted) if emitted else None,
        draft_ms=s["draft_ms"],
        verify_ms=s["verify_ms"],
        round_ms=s["round_ms"],
        target_top=_tops(s.get("target_top")),
        draft_top=_tops(s.get("draft_top")),
        residual_top=_tops(s.get("residual_top")),
        match=Match(**match) if match else None,
        tree=None if s.get("tree") is None else [TreeNode(**n) for n in s["tree"]],
        translation=None if s.get("translation") is None else Translation(**s["translation"]),
    )


EVENT_COLUMNS = [
    "round",
    "position",
    "kind",
    "token_id",
    "text",
    "q",
    "p",
    "accept_prob",
    "u",
    "output_index",
]


def token_events(trace: Trace) -> list[dict[str, Any]]:
    """Flatten a trace into token events.

    `position` is the draft position within the round (0-based; the emitted
    token sits at `n_accepted`); `output_index` numbers the tokens of the
    output and is None for rejected and discarded drafts. Prompt tokens are
    not repeated here (the trace stores the prompt text and count in `meta`).
    """
    rows: list[dict[str, Any]] = []
    out = 0
    for i, r in enumerate(trace.rounds):
        for j, (tok, v) in enumerate(zip(r.draft, r.verdicts)):
            kept = v.kind == "accepted"
            rows.append(
                {
                    "round": i,
                    "position": j,
                    "kind": v.kind,
                    "token_id": tok.id,
                    "text": tok.text,
                    "q": tok.q,
                    "p": v.p,
                    "accept_prob": v.accept_prob,
                    "u": v.u,
                    "output_index": out if kept else None,
                }
            )
            out += kept
        if r.emitted is not None:
            e = r.emitted
            rows.append(
                {
                    "round": i,
                    "position": r.n_accepted,
                    "kind": e.kind,
                    "token_id": e.id,
                    "text": e.text,
                    "q": None,
                    "p": e.p,
                    "accept_prob": None,
                    "u": None,
                    "output_index": out,
                }
            )
            out += 1
    return rows


# -- validation ---------------------------------------------------------------


def validate(trace: Trace) -> None:
    """Raise TraceError naming the first way the trace contradicts itself.

    Run on every trace that comes from outside (an upload, a file), so a
    corrupt one is refused with one line instead of breaking a view: every
    field a view reads is checked for its type here, then the rounds for
    their logic.
    """
    problem = _meta_problem(trace.meta.to_dict()) or _parts_problem(trace)
    if problem:
        raise TraceError(problem)
    sampled = not trace.meta.sampling.greedy
    for i, s in enumerate(trace.rounds):
        problem = _round_problem(s, i == len(trace.rounds) - 1, sampled)
        if problem:
            raise TraceError(f"round {i + 1}: {problem}")
    if trace.emitted_ids() != trace.output.token_ids:
        raise TraceError("the rounds do not rebuild the output tokens")
    for key, value in (
        ("rounds", len(trace.rounds)),
        ("new_tokens", len(trace.output.token_ids)),
        ("proposed", sum(r.k for r in trace.rounds)),
        ("accepted", sum(r.n_accepted for r in trace.rounds)),
    ):
        if getattr(trace.totals, key) != value:
            raise TraceError(f"totals.{key} is {getattr(trace.totals, key)!r} but the rounds give {value}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(_is_int(i) for i in x)


def _meta_problem(meta: dict[str, Any]) -> str | None:
    for key in (
        "prompt",
        "target",
        "target_source",
        "draft",
        "draft_kind",
        "device",
        "dtype",
        "started",
        "stopped",
    ):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            return f"meta.{key} must be text"
    for key in ("compiled", "row_kernel", "packed_output_layer", "chat_template"):
        if not isinstance(meta.get(key, False), bool):
            return f"meta.{key} must be true or false"
    for key in ("prompt_tokens", "max_new_tokens", "tree_nodes", "branch"):
        if not _is_int(meta.get(key, 0)):
            return f"meta.{key} must be a whole number"
    if not _is_texts(meta.get("prompt_token_texts", [])):
        return "meta.prompt_token_texts must be a list of texts"
    versions = meta.get("versions", {})
    if not (isinstance(versions, dict) and _is_texts(list(versions.values()))):
        return "meta.versions must map names to texts"
    sampling = meta.get("sampling", {})
    if not (
        isinstance(sampling, dict)
        and isinstance(sampling.get("greedy", True), bool)
        and all(_is_num(sampling.get(key, 0)) for key in ("temperature", "top_p"))
        and all(_is_int(sampling.get(key, 0)) for key in ("top_k", "seed"))
    ):
        return "meta.sampling must be an object: greedy true or false, temperature and top_p numbers, top_k and seed whole"
    policy = meta.get("policy", {})
    if not (
        isinstance(policy, dict)
        and isinstance(policy.get("name", ""), str)
        and _is_int(policy.get("k", 0))
        and (policy.get("min_confidence") is None or _is_num(policy["min_confidence"]))
    ):
        return (
            "meta.policy must be an object with a name, a whole-number k and min_confidence a number or null"
        )
    return None


def _is_texts(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, str) for t in x)


def _parts_problem(trace: Trace) -> str | None:
    out, base = trace.output, trace.baseline
    if not isinstance(out.text, str) or not _is_ids(out.token_ids):
        return "output needs a text and a list of whole-number token ids"
    if base is not None and not (
        isinstance(base.text, str)
        and _is_ids(base.token_ids)
        and _is_num(base.wall_s)
        and _is_num(base.tokens_per_s)
        and isinstance(base.token_times_s, list)
        and all(_is_num(t) for t in base.token_times_s)
    ):
        return "baseline needs a text, token ids, wall_s, tokens_per_s and token times as numbers"
    return None


check_invariants = validate  # the name the tests grew up with


def _is_prob(x: Any) -> bool:
    # 1e-4 of slack: float32 softmax sums can round just past 1.
    return _is_num(x) and -1e-4 <= x <= 1 + 1e-4


def _round_problem(s: Round, is_last: bool, sampled: bool) -> str | None:
    if not _is_int(s.k) or not _is_int(s.n_accepted):
        return "k and n_accepted must be whole numbers"
    if not all(_is_num(t) and t >= 0 for t in (s.draft_ms, s.verify_ms, s.round_ms)):
        return "draft_ms, verify_ms and round_ms must be numbers of milliseconds"
    for name in ("target_top", "draft_top", "residual_top"):
        top = getattr(s, name)
        if top is not None and not all(
            _is_int(t.id) and isinstance(t.text, str) and _is_prob(t.prob) for t in top
        ):
            return f"{name} needs tokens with a whole-number id, a text and a probability"
    if s.match is not None and not (_is_int(s.match.start) and _is_int(s.match.ngram) and s.match.start >= 0):
        return "match needs a whole-number start and n-gram length"
    if s.tree is not None and (problem := _tree_problem(s)):
        return problem
    if s.translation is not None and (problem := _translation_problem(s)):
        return problem
    if not s.k == len(s.draft) == len(s.verdicts):
        return f"k is {s.k} but it has {len(s.draft)} draft tokens and {len(s.verdicts)} verdicts"
    if not 0 <= s.n_accepted <= s.k:
        return f"n_accepted {s.n_accepted} is outside 0..{s.k}"
    for j, (tok, v) in enumerate(zip(s.draft, s.verdicts)):
        problem = _token_problem(tok, v, verdict_kind(j, s.n_accepted), sampled)
        if problem:
            return f"draft position {j + 1}: {problem}"
    if s.emitted is None:
        if s.n_accepted == 0 or not is_last:
            return "nothing was emitted, which only the last round may do after an accepted end of text"
        return None
    expected = "bonus" if s.n_accepted == s.k else "correction"
    if s.emitted.kind != expected:
        return f"the emitted token is a {s.emitted.kind!r}, expected a {expected!r}"
    if not _is_int(s.emitted.id) or not isinstance(s.emitted.text, str) or not _is_prob(s.emitted.p):
        return "the emitted token needs a whole-number id, a text and a probability p"
    return None


def _translation_problem(s: Round) -> str | None:
    t = s.translation
    if not (_is_ids(t.ids) and _is_texts(t.texts) and len(t.ids) == len(t.texts)):
        return "translation needs the draft's token ids and one text for each"
    if t.mode not in ("text", "vocab"):
        return f"translation mode must be 'text' or 'vocab', got {t.mode!r}"
    if len(t.sources) != s.k:
        return f"translation has sources for {len(t.sources)} tokens, but the round drafted {s.k}"
    if not all(
        isinstance(src, list) and all(_is_int(i) and 0 <= i < len(t.ids) for i in src) for src in t.sources
    ):
        return "translation sources must be indices of the draft's own tokens"
    return None


def _tree_problem(s: Round) -> str | None:
    """Parents first, depths that follow them, and an accepted path that is the draft's accepted prefix."""
    for i, node in enumerate(s.tree):
        if not (_is_int(node.id) and isinstance(node.text, str) and _is_prob(node.q)):
            return f"tree node {i}: needs a whole-number id, a text and a probability q"
        if not (_is_int(node.parent) and -1 <= node.parent < i and _is_int(node.depth)):
            return f"tree node {i}: its parent must be an earlier node or -1"
        if node.depth != (1 if node.parent < 0 else s.tree[node.parent].depth + 1):
            return f"tree node {i}: depth {node.depth} does not follow its parent's"
        if not (node.p is None or _is_prob(node.p)) or not isinstance(node.accepted, bool):
            return f"tree node {i}: p must be a probability or null, accepted true or false"
        if node.accepted and not (node.parent < 0 or s.tree[node.parent].accepted):
            return f"tree node {i}: accepted below a node that was not"
    path = [n.id for n in s.tree if n.accepted]
    if path != [t.id for t in s.draft[: s.n_accepted]]:
        return "the tree's accepted path is not the draft's accepted tokens"
    return None


def _token_problem(tok: DraftToken, v: Verdict, kind: str, sampled: bool) -> str | None:
    if not _is_int(tok.id) or not isinstance(tok.text, str) or not _is_prob(tok.q):
        return "a draft token needs a whole-number id, a text and a probability q"
    if v.kind != kind or v.accepted != (kind == "accepted"):
        return f"the verdict says {v.kind!r} (accepted={v.accepted}) but its place in the round makes it {kind!r}"
    if kind == "discarded":
        if (v.p, v.accept_prob, v.u) != (None, None, None):
            return "a discarded token was never judged, so its p, accept_prob and u must be null"
    elif not (
        _is_prob(v.p)
        and _is_prob(v.accept_prob)
        and (_is_prob(v.u) if sampled else v.u is None or _is_prob(v.u))
    ):
        return "a judged token needs p and accept_prob between 0 and 1 (and u, when sampling)"
    return None


# -- what "compared with plain decoding" may promise -------------------------


@dataclass
class Agreement:
    """How a run's output relates to plain decoding's, and what that means."""

    label: str  # a card's label
    value: str  # a card's value: ✓, ✗, ≈ ...
    good: bool | None  # green, red, or neither (nothing was promised)
    sentence: str  # one line for the CLI and captions
    first_difference: int | None = None  # the first output position that differs


def agreement(trace: Trace) -> Agreement | None:
    """What a comparison with plain decoding shows, by what the run promises.

    Greedy in float32 or float64 promises the same tokens. Sampling promises
    only the same distribution, so two runs differ by design. Greedy in 16-bit
    floats rounds a k-token pass differently from a one-token one, so a
    near-tie may flip: a difference there is expected, and where it starts
    is worth showing.
    """
    if trace.baseline is None:
        return None
    ours, plain = trace.output.token_ids, trace.baseline.token_ids
    first = next((i for i, (a, b) in enumerate(zip(ours, plain)) if a != b), None)
    if first is None and len(ours) != len(plain):
        first = min(len(ours), len(plain))
    if not trace.meta.sampling.greedy:
        return Agreement(
            "same distribution as plain sampling",
            "≈",
            None,
            "same distribution as plain sampling (not token-identical by design)",
            first,
        )
    if first is None:
        return Agreement("identical to plain decoding", "✓", True, "output identical to plain decoding")
    where = f"first difference at output token {first + 1}"
    if trace.meta.dtype in ("bfloat16", "float16"):
        return Agreement(
            f"may differ at near-ties ({trace.meta.dtype})",
            f"≠ from token {first + 1}",
            None,
            f"output differs from plain decoding, {where}: expected in {trace.meta.dtype}, "
            "whose k-token and one-token passes round near-ties differently",
            first,
        )
    return Agreement(
        "identical to plain decoding", "✗", False, f"output DIFFERENT from plain decoding, {where}", first
    )
