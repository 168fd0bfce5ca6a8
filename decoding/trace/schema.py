"""The Trace's schema: one run of the decoder, every proposal and every verdict, and its JSON.

Pure Python (plus pandas for the flat view) so that `visualize/` and a
classroom laptop can load and chart a saved trace without torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import SpecLensError, TraceError
from ..settings.policies import Policy
from ..settings.sampling import Sampling
from .fields import is_num, meta_problem
from .migrate import drafted_not_k, rounds_not_steps, target_alone

TOKEN_KINDS = ("prompt", "accepted", "rejected", "discarded", "correction", "bonus", "target")
# 1: verdicts without `kind`, discarded tokens carried numbers. 2: kinds, top-5 lists, n-gram matches.
# 3: "rounds" (not "steps"), `round_ms`, totals with `rounds` and `tokens_per_round`.
# 4: a round that drafted nothing emits the target's own token as kind "target" (was "bonus").
# 5: a round's `drafted` (was `k`): the tokens it drafted, which a policy may make fewer than its k.
TRACE_VERSION = 6


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
    entropy: float | None = None  # the target's entropy (nats) here; None where not judged or not recorded


@dataclass
class Emitted:
    id: int
    text: str
    kind: str  # "correction", "bonus", or "target" when the round drafted nothing
    p: float  # the target's probability of this token
    entropy: float | None = None  # the target's entropy (nats) where it wrote this token


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
    # The tokens drafted (a tree round: its main line's); k is what the policy asked for,
    # and a policy, the budget or a short n-gram match may draft fewer.
    drafted: int
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
    source: str | None = None  # a draft of several sources (ngram+head): the one that drafted this round
    # A batched run's round: the rows its target pass checked for every sequence in it, and that
    # pass's whole time (verify_ms is this sequence's share: the pass's time by its share of the rows).
    pass_rows: int | None = None
    pass_ms: float | None = None

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
        return 1 + (len(self.tree) if self.tree is not None else self.drafted)


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
    token_texts: list[str] = field(default_factory=list)  # each token's own text (empty in older traces)


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

    @property
    def tokens_in_rounds(self) -> str:
        """'1 token in 1 round', '12 tokens in 5 rounds': how far the run went, in words."""
        return f"{self.new_tokens} token{'s' * (self.new_tokens != 1)} in {self.rounds} round{'s' * (self.rounds != 1)}"

    @classmethod
    def of_rounds(cls, rounds: list[Round], wall_s: float) -> Totals:
        """Whatever the rounds did not time (the prefill, mostly) is the prefill."""
        return cls.of_counts(
            len(rounds),
            sum(r.new_tokens for r in rounds),
            sum(r.drafted for r in rounds),
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
            ok = isinstance(value, bool) if key == "identical_to_baseline" else is_num(value)
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
    row_kernel: bool = False  # linear layers through SpecLens's kernel (decoding/runtime/rowlinear.py)
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
    batch_size: int = 1  # sequences decoded together (continuous batching), this one among them
    batch_sequence: int = 0  # this sequence's place in its batch run's prompts, from 0

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
        problem = meta_problem(data)
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

    def left_to_the_target(self, index: int) -> bool:
        """Round `index` drafted nothing because the token limit left room for one token only:
        the target's own. The loop drafts at most max_new_tokens - produced - 1, so only the
        last round can be such a round."""
        limit, rounds = self.meta.max_new_tokens, self.rounds
        if not limit or index != len(rounds) - 1 or rounds[index].drafted:
            return False
        return sum(r.new_tokens for r in rounds[:index]) == limit - 1

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
                data = rounds_not_steps(data)
            if version < 4:
                data = target_alone(data)
            if version < 5:
                data = drafted_not_k(data)
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
        """A trace file; anything that is not one is a TraceError naming why, in SpecLens's words."""
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except UnicodeDecodeError:  # an image, an archive, a model file...
            raise TraceError(
                "not a SpecLens trace: the file is not text (a trace is JSON in UTF-8)"
            ) from None
        except OSError as exc:  # missing, a folder, unreadable
            raise TraceError(f"cannot read the trace {path}: {exc.strerror or exc}") from None
        return cls.from_json(text)


def _tops(rows: list[dict] | None) -> list[TopToken] | None:
    return None if rows is None else [TopToken(**r) for r in rows]


def _round_from_dict(s: dict[str, Any]) -> Round:
    emitted, match = s.get("emitted"), s.get("match")
    return Round(
        drafted=s["drafted"],
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
        source=s.get("source"),
        pass_rows=s.get("pass_rows"),
        pass_ms=s.get("pass_ms"),
    )
