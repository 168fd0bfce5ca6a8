"""Training a draft head by self-distillation, resumable at any point.

1. answers: the target's own answers to the training prompts, generated in
   batches (greedy, plus `sampled` answers per prompt at temperature 0.7),
   appended to the work folder as they are made;
2. the draft vocabulary: the tokens the answers (the target's own, or conversations') use most;
3. training: EAGLE-3's training-time test, one sequence a step, the target's
   features recomputed for each sequence as it is trained on (stored, tens of
   thousands of sequences' features would take tens of gigabytes). The head is
   unrolled `steps` steps, each step reading the previous step's own output
   feature, exactly as it drafts; the loss is the cross-entropy against the
   target's distribution over the draft vocabulary at every answer position and
   a share of the prompt's, step j weighted 0.8^(j-1). Why EAGLE-3's and not
   EAGLE-1's feature loss: drafting k tokens feeds the head its own features
   from the second token on, and training on them is what keeps acceptance up at
   positions 2 and 3. A share of the prompts is held out; the head is measured
   on their answers every `eval_every` sequences and the best measurement is kept.

The answers file and a checkpoint every `checkpoint_every` sequences (or
`checkpoint_minutes`, whichever comes first: long sequences are slow) let an
interrupted run resume where it stopped; `stages.json` adds up each stage's
minutes over the runs. Nothing here is used at decoding time.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import functools
import json
import math
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.batch import BatchSettings, batch_generate
from ..core.graphs import use_batch_graphs
from ..drafts.head import EagleHead, FeatureTap, HeadConfig, fingerprint, load_head, save_head
from ..errors import SpecLensError
from ..models.loading import LoadedModel
from ..models.text import chat_text, eos_ids
from ..settings.sampling import Sampling
from .answers import MANIFEST, AnswerStore, prompt_hash
from .bench import machine
from .training_data import read_training_rows


@dataclass
class TrainConfig:
    answer_tokens: int = 128
    sampled: int = 0  # sampled answers per prompt, besides the greedy one
    batch_size: int = 16
    draft_vocab: int = 16384
    steps: int = 3  # training-time-test depth
    epochs: int = 5
    max_sequences: int = 0  # sequences trained on in all, 0 = epochs × training sequences
    lr: float = 1e-3
    prompt_share: float = 0.2  # share of prompt positions trained on; every answer position is
    holdout: float = 0.1  # share of the prompts held out to measure the head and keep its best
    heldout_max: int = 200  # held-out sequences measured (their features are kept in memory)
    eval_every: int = 2000  # sequences between two held-out measurements
    checkpoint_every: int = 250
    checkpoint_minutes: float = 10.0
    tune_lm_head: bool = False  # train the output layer too (it starts as the target's rows)
    max_len: int = 768  # tokens of prompt + answer kept (the end of longer ones)
    seed: int = 0
    limit: int = 0  # prompts used, 0 = all (CI's short run)
    init_from: str = ""  # a head folder whose layer the head starts from ("" = random)
    answer_dtype: str = (
        "float32"  # the answers' generation may run in bfloat16, twice as fast where the CPU has it
    )


# --- stage 1: answers ---------------------------------------------------------


def answer_batch(
    model: LoadedModel, prompts: list[str], max_new_tokens: int, sampling: Sampling
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of each prompt, decoded together on the batched path (`core.batch`:
    one target pass a step for every answer still going, each ending at its own EOS): the stage's one
    generation call."""
    tok = model.tokenizer
    ids = [
        torch.tensor([tok(chat_text(tok, p), add_special_tokens=False).input_ids], device=model.device)
        for p in prompts
    ]
    settings = BatchSettings(len(prompts), sampling, max_new_tokens, eos_ids(model.model, tok))
    use_batch_graphs(model.model, len(prompts), max(i.shape[1] for i in ids) + max_new_tokens, 0, None)
    run = batch_generate(model.model, ids, settings)
    return [(i[0].tolist(), answer) for i, answer in zip(ids, run.outputs, strict=True)]


def answer_jobs(
    rows: list[dict], variants: int, have: set[tuple[str, int]], size: int
) -> list[tuple[int, list[int]]]:
    """Batches of the rows whose (prompt hash, variant) no shard holds yet: by variant, each
    prompt once, shortest first so that a batch pads little. A conversation gets no answer."""
    batches = []
    for variant in range(variants):
        todo = {}
        for i, row in enumerate(rows):
            if "messages" not in row and (row["hash"], variant) not in have:
                todo.setdefault(row["hash"], i)
        order = sorted(todo.values(), key=lambda i: len(rows[i]["prompt"]))
        batches += [(variant, order[b : b + size]) for b in range(0, len(order), size)]
    return batches


@torch.inference_mode()
def answer_prompts(model: LoadedModel, rows: list[dict], cfg: TrainConfig, store: AnswerStore) -> dict:
    """Stage 1: the model's answers to every prompt of `rows` no shard holds yet, into new shards
    of `store` (resumable: a stopped stage closes its shard, the next skips what is answered).
    Returns how many answers and answer tokens it made, and in how many seconds."""
    mark = fingerprint(model.model)
    have = {(r["hash"], r["variant"]) for r in store.read(mark)}
    batches = answer_jobs(rows, 1 + cfg.sampled, have, cfg.batch_size)
    decoding = {"path": "batched (decoding/core/batch.py)", "greedy": True, "sampled_per_prompt": cfg.sampled,
                "max_new_tokens": cfg.answer_tokens, "dtype": str(model.dtype).removeprefix("torch.")}  # fmt: skip
    done = {"answers": 0, "answer_tokens": 0, "seconds": 0.0}
    started = time.monotonic()
    bar = tqdm(total=sum(len(b) for _, b in batches), desc="answers", unit="answer", disable=not batches)
    with store.writer(model.name, mark, decoding, machine()) as writer:
        for n, (variant, batch) in enumerate(batches):
            seed = cfg.seed * 1000 + variant * 100 + n
            sampling = Sampling(0.7, seed=seed) if variant else Sampling()
            began = time.monotonic()
            made = answer_batch(model, [rows[i]["prompt"] for i in batch], cfg.answer_tokens, sampling)
            took = time.monotonic() - began
            records = [
                {
                    "hash": rows[i]["hash"],
                    "source": rows[i]["source"],
                    "prompt": rows[i]["prompt"],
                    "prompt_tokens": len(prompt_ids),
                    "variant": variant,
                    "answer": answer,
                }
                for i, (prompt_ids, answer) in zip(batch, made)
            ]
            written = writer.add(records, took)
            done["answers"] += written
            done["answer_tokens"] += sum(len(r["answer"]) for r in records[:written])
            elapsed = time.monotonic() - started
            done["seconds"] = round(elapsed, 1)
            if written < len(records):
                print(f"{store.folder}: no new shard fits in {store.total_bytes:,} bytes in all: stopping")
                break
            bar.update(len(records))
            bar.set_postfix(tokens_s=f"{done['answer_tokens'] / elapsed:.1f}", shard=writer.name)
    bar.close()
    return done


def stored_answers(
    tokenizer, rows: list[dict], records: list[dict], variants: int
) -> tuple[list[dict], list[dict]]:
    """(rows, answers) as training reads them: `rows` with a row added for each answered prompt
    they lack, and per stored answer of a variant below `variants` its ids (prompt + answer), the
    prompt's length and the index of its row."""
    rows = list(rows)
    index: dict[str, int] = {}
    for i, row in enumerate(rows):
        if "messages" not in row:
            index.setdefault(row["hash"], i)
    kept = [r for r in records if r["variant"] < variants]
    for r in kept:
        if r["hash"] not in index:
            index[r["hash"]] = len(rows)
            rows.append({"prompt": r["prompt"], "source": r["source"], "hash": r["hash"]})
    texts = [chat_text(tokenizer, r["prompt"]) for r in kept]
    prompt_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if kept else []
    answers = []
    for r, ids in zip(kept, prompt_ids):
        if len(ids) != r["prompt_tokens"]:
            raise SpecLensError(
                f"a stored answer's prompt ({r['hash']}) makes {len(ids)} tokens, not the "
                f"{r['prompt_tokens']} it was answered from: another tokenizer than the shards' target"
            )
        answers.append({"prompt": index[r["hash"]], "variant": r["variant"], "ids": ids + r["answer"],
                        "prompt_len": len(ids)})  # fmt: skip
    return rows, sorted(answers, key=lambda a: (a["variant"], a["prompt"]))


# --- stage 2: the training sequences and the draft vocabulary -----------------


def training_sequences(tokenizer, rows: list[dict], answers: list[dict], max_len: int) -> list[dict]:
    """The sequences trained on: per generated answer (`stored_answers`), its ids (the last
    `max_len` of prompt + answer); per conversation, each `max_len` window of its ids. Each has `answer`, which of its
    tokens an assistant wrote, and the index of its row. Features are not kept: each is recomputed
    when trained on (see train)."""
    out = []
    for r in answers:
        ids = torch.tensor(r["ids"][-max_len:])
        answer = torch.arange(len(r["ids"]))[-max_len:] >= r["prompt_len"]
        out.append({"ids": ids, "answer": answer, "prompt": r["prompt"], "variant": r["variant"]})
    for i, row in enumerate(rows):
        if "messages" in row:
            ids, answer = conversation_ids(tokenizer, row["messages"])
            for start in range(0, len(ids) - 1, max_len):
                window = slice(start, start + max_len)
                if answer[window].any():
                    out.append(
                        {
                            "ids": ids[window],
                            "answer": answer[window],
                            "prompt": i,
                            "variant": 0,
                            "written": True,
                        }
                    )
    return out


def conversation_ids(tokenizer, messages: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """A conversation's token ids in the chat template, and which of them are an assistant's
    (from after its turn's header to its end-of-turn token, which it must learn to predict too).

    The text is tokenized once; each turn's span is found by the length of the template's text up
    to it, which is a prefix of the whole (tokenizing every prefix instead is quadratic)."""

    def chars(upto: int, header: bool) -> int:
        return len(
            tokenizer.apply_chat_template(messages[:upto], add_generation_prompt=header, tokenize=False)
        )

    text = tokenizer.apply_chat_template(messages, tokenize=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor(enc["input_ids"])
    starts = torch.tensor([start for start, _ in enc["offset_mapping"]])
    answer = torch.zeros(len(ids), dtype=torch.bool)
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            answer |= (starts >= chars(i, True)) & (starts < chars(i + 1, False))
    return ids, answer


def draft_vocabulary(data: list[dict], vocab_size: int, size: int) -> tuple[torch.Tensor, float]:
    """The `size` tokens most frequent in the greedy and written answers, sorted by id, and the
    share of those answers' tokens they cover."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for d in data:
        if d["variant"] == 0:
            counts += torch.bincount(d["ids"][d["answer"]], minlength=vocab_size)[:vocab_size]
    size = min(size, vocab_size)
    chosen = torch.topk(counts, size).indices.sort().values
    return chosen, float(counts[chosen].sum() / max(int(counts.sum()), 1))


@torch.no_grad()
def with_features(target: LoadedModel, tap: FeatureTap, d: dict) -> dict:
    """`d` with the target's tapped features [T, 3h], final hidden state [T, h] and top token [T]
    (over its whole vocabulary) for its ids.

    Recomputed each time a sequence is trained on rather than stored: tens of thousands
    of sequences' features would take tens of gigabytes, and a target pass costs less
    than the head's training step on the same sequence."""
    rows: dict = {}
    with tap.recording(rows):
        final = target.model.model(input_ids=d["ids"][None].to(target.device)).last_hidden_state[0]
    out_rows = target.model.get_output_embeddings().weight
    top = torch.cat([(chunk @ out_rows.T).argmax(-1) for chunk in final.split(512)])
    return d | {"aux": tap.take(rows).float().cpu(), "final": final.float().cpu(), "top": top.cpu()}


def halved(d: dict) -> dict:
    return d | {"aux": d["aux"].half(), "final": d["final"].half()}


# --- stage 3: training --------------------------------------------------------


def new_head(target: LoadedModel, draft_ids: torch.Tensor, seed: int, init_from: str = "") -> EagleHead:
    """A head with EAGLE-3's shape for the target, its output layer started from the target's rows;
    with `init_from`, its layer (fc, midlayer, norm) starts as that head folder's."""
    torch.manual_seed(seed)
    c = HeadConfig.for_target(target.model.config, len(draft_ids))
    head = EagleHead(c)
    for m in head.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.02)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.model.get_output_embeddings().weight[draft_ids].float().cpu())
        head.norm.weight.copy_(target.model.model.norm.weight.float().cpu())
        head.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        head.t2d.zero_()
        head.t2d[draft_ids] = True
    if init_from:
        start = load_head(init_from, target.model, torch.device("cpu"), torch.float32)
        head.load_state_dict(started_layer(head, start))
    return head


def started_layer(head: EagleHead, start: EagleHead) -> dict[str, torch.Tensor]:
    """`head`'s weights with `start`'s layer in place of its own. The vocabulary and output layer
    stay `head`'s: both heads' output layers are the target's own rows, so the layer's output
    means the same to either, whatever tokens each drafts."""
    if start.c.aux_layers != head.c.aux_layers:
        raise SpecLensError(
            f"--init-from's head reads layers {list(start.c.aux_layers)}, this run's {list(head.c.aux_layers)}"
        )
    layer = {n: t for n, t in start.state_dict().items() if n.split(".")[0] in ("fc", "midlayer", "norm")}
    return head.state_dict() | layer


def ttt_unroll(
    head: EagleHead,
    embed: torch.Tensor,
    ids: torch.Tensor,
    aux: torch.Tensor,
    origins: torch.Tensor,
    steps: int,
) -> list[torch.Tensor]:
    """The head's output rows at each of `steps` draft steps from each origin ([m, h] per step).

    Origin t reads (feature t, token t+1) at step 1 and (its own step j-1
    output, token t+j) at step j. Its queries see step 1's rows up to t (the
    target's real features) and its own later steps: what the head sees when
    it drafts from t. Every position lends step 1 its keys and values; only the
    origins asked for are unrolled, which is most of a long prompt's cost saved.
    """
    attn, mid = head.midlayer.self_attn, head.midlayer
    n = ids.shape[0] - 1
    everyone = torch.arange(n)
    feature = head.fc(aux[:n])
    q, k, v = attn.project(mid.attention_input(embed[ids[1:]], feature), everyone)
    keys, values = [attn.expand(k)], [attn.expand(v)]
    q, feature = q[:, origins], feature[origins]
    hidden = ~(everyone[None, :] <= origins[:, None])  # step 1's rows after the origin
    outputs = []
    for j in range(1, steps + 1):
        if j > 1:
            tokens = ids[(origins + j).clamp(max=n)]
            q, k, v = attn.project(mid.attention_input(embed[tokens], feature), origins + j - 1)
            keys.append(attn.expand(k))
            values.append(attn.expand(v))
        q = q / math.sqrt(head.c.head_dim)
        s1 = (q @ keys[0].transpose(1, 2)).masked_fill(hidden, float("-inf"))  # [H, m, n]
        own = [(q * kk).sum(-1, keepdim=True) for kk in keys[1:]]  # its own rows of later steps
        w = torch.cat([s1, *own], dim=-1).softmax(-1)
        attended = w[..., :n] @ values[0]
        for i, vv in enumerate(values[1:]):
            attended = attended + w[..., n + i : n + i + 1] * vv
        feature = mid.finish(feature, attended)
        outputs.append(feature)
    return outputs


def ttt_loss(
    head: EagleHead,
    embed: torch.Tensor,
    d: dict,
    label_rows: torch.Tensor,
    steps: int,
    prompt_share: float,
    generator: torch.Generator | None = None,
):
    """Training-time test on one sequence: (loss, [(agreeing, judged) answer rows per step]).

    Step j from origin t predicts the target's distribution at position t+j.
    Every origin in an answer is trained, and a random `prompt_share` of the
    others: drafting happens in answers. A label whose target token is outside
    the draft vocabulary is left out, as EAGLE-3 does: the head cannot propose it.
    """
    ids, aux, final = d["ids"], d["aux"].float(), d["final"].float()
    n = ids.shape[0] - 1  # origins 0 .. T-2
    if n < 1:
        return None, []
    everyone = torch.arange(n)
    answer = d["answer"][1:]  # its first label is in an answer
    origins = everyone[answer | (torch.rand(n, generator=generator) < prompt_share)]
    reachable = head.t2d[d["top"]] if "top" in d else torch.ones(n + 1, dtype=torch.bool)
    loss, figures = torch.zeros(()), []
    for j, out in enumerate(ttt_unroll(head, embed, ids, aux, origins, steps), start=1):
        valid = origins + j <= n  # the input token t+j exists
        if not valid.any():
            break
        out, label = out[valid], (origins + j)[valid]
        with torch.no_grad():
            target_logits = final[label] @ label_rows.T
        logp = head.logits(out).log_softmax(-1)
        kept = reachable[label]
        if kept.any():
            soft = target_logits[kept].softmax(-1)
            loss = loss + (0.8 ** (j - 1)) * -(soft * logp[kept]).sum(-1).mean()
        # Agreement counts every answer position: one the head cannot reach is one it gets wrong.
        judged = d["answer"][label]
        agree = (logp.argmax(-1) == target_logits.argmax(-1)) & kept
        figures.append((int(agree[judged].sum()), int(judged.sum())))
    return (loss, figures) if figures else (None, [])


def heldout_split(data: list[dict], share: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held out): every sequence of a `share` of the prompts is held out, so the
    held-out agreement is measured on prompts the head never saw in any variant."""
    prompts = sorted({d["prompt"] for d in data})
    held = set(random.Random(seed).sample(prompts, round(share * len(prompts)))) if share > 0 else set()
    return [d for d in data if d["prompt"] not in held], [d for d in data if d["prompt"] in held]


@torch.no_grad()
def agreement(head: EagleHead, embed: torch.Tensor, data: list[dict], label_rows: torch.Tensor, steps: int):
    """Top-1 agreement with the target on the answers of `data`, by draft step (teacher-forced)."""
    head.eval()
    sums = [[0, 0] for _ in range(steps)]
    for d in data:
        _, counts = ttt_loss(head, embed, d, label_rows, steps, 0.0)
        for s, (agree, judged) in zip(sums, counts):
            s[0], s[1] = s[0] + agree, s[1] + judged
    return [round(a / max(b, 1), 4) for a, b in sums]


def train(
    head: EagleHead,
    target: LoadedModel,
    fit: list[dict],
    held: list[dict],
    cfg: TrainConfig,
    checkpoint: Path,
    stop_at: int | None = None,
) -> dict:
    """Trains in place, one sequence a step, resuming from `checkpoint` wherever it stopped;
    measures `held` every `eval_every` sequences and at the end, and leaves the head at its best
    measurement (the last one without held-out prompts). Returns that one's figures, the tokens
    trained on and every measurement (`heldout_curve`). Asked for fewer sequences than the
    checkpoint has seen, it trains none and gives the best so far. `stop_at` stops after that
    many sequences with a checkpoint, as an interrupted run does."""
    embed = target.model.get_input_embeddings().weight.detach().float().cpu()
    label_rows = target.model.get_output_embeddings().weight.detach().float().cpu()[head.draft_ids]
    total = cfg.max_sequences or cfg.epochs * len(fit)
    params, opt, sched = optimizer(head, cfg, total)
    state = resumed(checkpoint, {"head": head, "opt": opt, "sched": sched}, cfg.steps)
    tap = FeatureTap.on(target.model, head.c.aux_layers)
    end = min(total, stop_at or total)
    # Measured again and again: computed once, in half precision (long sequences are large); not
    # at all by a stage that only writes the best head so far.
    skip = state["seen"] >= end and "head" in state["best"]
    held = [] if skip else [halved(with_features(target, tap, d)) for d in held]
    if cfg.init_from and state["seen"] == 0:  # where the started head stands, kept if nothing beats it
        measure(head, embed, held, label_rows, cfg, state, len(fit))
    saved_at = time.monotonic()
    bar = tqdm(total=total, initial=state["seen"], desc="train", unit="seq", disable=state["seen"] >= end)
    while state["seen"] < end:
        step = state["seen"]
        d = with_features(
            target, tap, fit[epoch_order(len(fit), step // len(fit), cfg.seed)[step % len(fit)]]
        )
        draw = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        loss, counts = ttt_loss(head, embed, d, label_rows, cfg.steps, cfg.prompt_share, draw)
        if loss is not None and loss.requires_grad:  # not when no label was reachable
            learn(loss, opt, params)
            bar.set_postfix(loss=f"{loss.item():.2f}")
        sched.step()
        counted(state, counts, int(d["ids"].shape[0]))
        bar.update(1)
        if state["seen"] % cfg.eval_every == 0 or state["seen"] == total:
            measure(head, embed, held, label_rows, cfg, state, len(fit))
        due = time.monotonic() - saved_at > 60 * cfg.checkpoint_minutes
        if due or state["seen"] % cfg.checkpoint_every == 0 or state["seen"] == end:
            saved_at = time.monotonic()
            torch.save(
                dict(head=head.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(), state=state),
                checkpoint,
            )
    bar.close()
    if state["seen"] < total:
        return {}
    if "head" not in state["best"]:  # a stage ended by a number the run had passed before measuring
        measure(head, embed, held, label_rows, cfg, state, len(fit))
    head.load_state_dict(state["best"]["head"])
    head.eval()
    return state["best"]["figures"] | {"tokens_trained": state["tokens"], "heldout_curve": state["curve"]}


def counted(state: dict, counts: list[tuple[int, int]], tokens: int) -> None:
    """One more sequence trained on: its tokens and its agreement by step added to the run's."""
    for s, (agree, judged) in zip(state["sums"], counts):
        s[0], s[1] = s[0] + agree, s[1] + judged
    state["seen"] += 1
    state["tokens"] += tokens


def resumed(checkpoint: Path, parts: dict, steps: int) -> dict:
    """The run's state where its checkpoint left it, `parts` loaded from it; a fresh state without one."""
    # `tokens` (trained on) and `curve` (every held-out measurement) are absent from older checkpoints.
    fresh = {
        "seen": 0,
        "sums": [[0, 0] for _ in range(steps)],
        "best": {"score": -1.0},
        "tokens": 0,
        "curve": [],
    }
    if not checkpoint.exists():
        return fresh
    saved = torch.load(checkpoint, weights_only=False)
    for name, part in parts.items():
        part.load_state_dict(saved[name])
    return fresh | saved["state"]


def learn(loss: torch.Tensor, opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    opt.step()


def optimizer(head: EagleHead, cfg: TrainConfig, total: int):
    """(trained parameters, AdamW, its schedule: 50 steps of warm-up, then a linear decay over `total`)."""
    # The output layer starts as the target's own rows; left as they are, the head
    # cannot overfit its largest matrix to a few hundred answers.
    head.lm_head.weight.requires_grad_(cfg.tune_lm_head)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / total)
    )
    return params, opt, sched


@functools.lru_cache(maxsize=2)
def epoch_order(n: int, epoch: int, seed: int) -> list[int]:
    """The order the training sequences are visited in that epoch: a resumed run finds its place."""
    return random.Random(seed * 1000 + epoch).sample(range(n), n)


def measure(
    head: EagleHead, embed: torch.Tensor, held: list[dict], label_rows: torch.Tensor, cfg: TrainConfig,
    state: dict, n_fit: int,
) -> None:  # fmt: skip
    """Held-out agreement now; the head is kept in `state["best"]` when it beats the best so far."""
    seen = state["seen"]
    figures = {
        "sequences_trained": seen,
        "epochs": round(seen / max(n_fit, 1), 2),
        "train_top1_by_step": [round(a / max(b, 1), 4) for a, b in state["sums"]],
    }
    state["sums"] = [[0, 0] for _ in range(cfg.steps)]
    if held:
        figures["heldout_top1_by_step"] = agreement(head, embed, held, label_rows, cfg.steps)
        print(f"after {seen} sequences: held-out agreement by step {figures['heldout_top1_by_step']}")
        state["curve"].append([seen, figures["heldout_top1_by_step"]])
        head.train()
    # Expected drafts accepted per round of `steps`, were the steps independent.
    score = sum(math.prod(figures.get("heldout_top1_by_step", [1])[: j + 1]) for j in range(cfg.steps))
    if not held or score >= state["best"]["score"]:
        state["best"] = {"figures": figures, "score": score, "head": copy.deepcopy(head.state_dict())}


def train_head(
    target: LoadedModel,
    prompts_path: Path | None,
    out: Path,
    work: Path,
    cfg: TrainConfig,
    command: str,
    answerer: LoadedModel | None = None,
    store: AnswerStore | None = None,
) -> dict:
    """The whole run: answers to the prompts no shard holds yet (by `answerer`, the target in
    another dtype, where given), training on every stored answer (and any conversations of the
    prompts file), then the head folder with its card. With no prompts file it trains on the
    stored answers as they stand."""
    rows = prompt_rows(prompts_path, cfg.limit) if prompts_path else []
    store = store or AnswerStore(work / "answers")
    work.mkdir(parents=True, exist_ok=True)
    # Everything but how long to train: a later run with more trains on from the checkpoint.
    same = asdict(cfg) | {"prompts": str(prompts_path), "target": target.name, "answers": str(store.folder)}
    settings = json.dumps(same | {"epochs": None, "max_sequences": None, "eval_every": None}, sort_keys=True)
    stamp = work / "settings.json"
    if stamp.exists() and stamp.read_text() != settings:
        raise SpecLensError(f"{work} holds a run with other settings: remove it or pass another --work")
    stamp.write_text(settings)
    with stage_clock(work, "answers"):
        answer_prompts(answerer or target, rows, cfg, store)
    records = store.read(fingerprint(target.model))
    rows, answers = stored_answers(target.tokenizer, rows, records, 1 + cfg.sampled)
    data = training_sequences(target.tokenizer, rows, answers, cfg.max_len)
    fit, held = heldout_split(data, cfg.holdout, cfg.seed)
    held = held[: cfg.heldout_max]
    draft_ids, coverage = draft_vocabulary(fit, target.vocab_size, cfg.draft_vocab)
    head = new_head(target, draft_ids, cfg.seed, cfg.init_from)
    with stage_clock(work, "training"):
        figures = train(head, target, fit, held, cfg, work / "checkpoint.pt")
    card = {
        "target": target.name,
        "fingerprint": fingerprint(target.model),
        "command": command,
        "data": data_summary(prompts_path.name if prompts_path else store.folder.name, fit, held, cfg),
        "answers": {"folder": str(store.folder)} | store.manifest().get("totals", {}),
        "date": _dt.date.today().isoformat(),
        "machine": machine(),
        "stage_minutes": json.loads((work / "stages.json").read_text()),
        "draft_vocab_coverage": round(coverage, 4),
        "settings": asdict(cfg),
        **figures,
    }
    save_head(head, out, card)
    (out / "README.md").write_text(head_card(card))
    return card


def answer_stage(
    model: LoadedModel, prompts_path: Path, work: Path, cfg: TrainConfig, store: AnswerStore
) -> dict:
    """The answer stage alone (`train-head --answers-only`): what it made, the shards' totals
    and the rate, in answers and answer tokens a second, on this machine."""
    rows = prompt_rows(prompts_path, cfg.limit)
    work.mkdir(parents=True, exist_ok=True)
    with stage_clock(work, "answers"):
        done = answer_prompts(model, rows, cfg, store)
    seconds = max(done["seconds"], 1e-9)
    rate = {
        "answers_per_s": round(done["answers"] / seconds, 3),
        "tokens_per_s": round(done["answer_tokens"] / seconds, 1),
    }
    return (
        done
        | rate
        | {
            "machine": machine(),
            "manifest": str(store.folder / MANIFEST),
            "totals": store.manifest().get("totals", {}),
        }
    )


def prompt_rows(path: Path, limit: int) -> list[dict]:
    """The first `limit` rows (0: all) of a training file, each with its prompt's hash and
    source (the file's name where the row names none); never the dev file."""
    if "dev" in path.name:
        raise SpecLensError("refusing to train on a dev file: the dev prompts are what heads are measured on")
    rows = read_training_rows(path)
    rows = rows[:limit] if limit else rows
    return [{"source": path.stem} | row | {"hash": prompt_hash(row["prompt"])} for row in rows]


def data_summary(name: str, fit: list[dict], held: list[dict], cfg: TrainConfig) -> str:
    """What the head was trained on, for its card: conversations as written, prompts the target
    answered, and the tokens and sequences of both."""
    written = [d for d in fit if d.get("written")]
    answered = [d for d in fit if not d.get("written")]
    parts = []
    if written:
        conversations = len({d["prompt"] for d in written})
        parts.append(
            f"{conversations:,} conversations as written ({len(written):,} windows of up to {cfg.max_len:,} tokens)"
        )
    if answered:
        sampled = f" and {cfg.sampled} sampled at temperature 0.7" if cfg.sampled else ""
        parts.append(
            f"{len({d['prompt'] for d in answered}):,} prompts with the target's own answers of up to "
            f"{cfg.answer_tokens} tokens (greedy{sampled}: self-distillation)"
        )
    tokens = sum(int(d["ids"].shape[0]) for d in fit)
    return (
        f"{name}: {' and '.join(parts)}; {tokens:,} tokens in {len(fit):,} sequences "
        f"({len(held)} sequences of other prompts held out)"
    )


@contextlib.contextmanager
def stage_clock(work: Path, stage: str) -> Iterator[None]:
    """Adds the minutes a stage ran to `work/stages.json`, over every resumed run. A long run is
    usually stopped with `kill`: SIGTERM ends the stage as an exception would, so those minutes
    count too (a SIGKILL's do not)."""
    started = time.time()
    main = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, _stop) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        path = work / "stages.json"
        minutes = json.loads(path.read_text()) if path.exists() else {}
        minutes[stage] = round(minutes.get(stage, 0.0) + (time.time() - started) / 60, 1)
        path.write_text(json.dumps(minutes))


def _stop(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def head_card(card: dict) -> str:
    """The head's README: what it drafts for, how it was made, and where it is measured."""
    top1 = ", ".join(f"{a:.2f}" for a in card.get("train_top1_by_step", []))
    held = ", ".join(f"{a:.2f}" for a in card.get("heldout_top1_by_step", [])) or "none"
    s = card["settings"]
    stages = ", ".join(f"{name} {minutes} min" for name, minutes in card["stage_minutes"].items())
    started = f", its layer started from `{s['init_from']}`" if s.get("init_from") else ""
    return f"""# EAGLE-3 draft head for {card["target"]}, trained by SpecLens

- Target: `{card["target"]}`, weights fingerprint `{card["fingerprint"]}` (a head is refused by any other weights)
- Layout: EAGLE-3 (`fc`, `midlayer`, `norm`, `lm_head` over a {s["draft_vocab"]}-token draft
  vocabulary covering {card["draft_vocab_coverage"]:.1%} of the answers' tokens trained on, `d2t`, `t2d`)
- Data: {card["data"]}
- Training: EAGLE-3 training-time test over {s["steps"]} steps{started}, {card["sequences_trained"]} sequences
  ({card["epochs"]} epochs), on {card["machine"]}, {card["date"]}; {stages}{training_speed(card)}
- Agreement with the target, by draft step (teacher-forced, on answers): {top1} on the
  training sequences since the previous measurement, {held} on prompts held out
{agreement_curve(card.get("heldout_curve", []))}- Command:

      {card["command"]}

Acceptance and speed on the dev prompts (never trained on) are measured by
`python -m decoding bench --draft head`; see docs/trained-head.md.
"""


def training_speed(card: dict) -> str:
    """'; N tokens trained on, at T tokens/s' where the run counted them."""
    minutes = card["stage_minutes"].get("training", 0)
    tokens = card.get("tokens_trained", 0)
    return (
        f"; {tokens:,} tokens trained on, at {tokens / (60 * minutes):.0f} tokens/s"
        if tokens and minutes
        else ""
    )


def agreement_curve(curve: list) -> str:
    """The held-out agreement at every measurement, one line each, for the card."""
    if len(curve) < 2:
        return ""
    lines = [
        f"  - after {seen:,} sequences: {', '.join(f'{a:.2f}' for a in by_step)}" for seen, by_step in curve
    ]
    return "- Held-out agreement by step at every measurement:\n" + "\n".join(lines) + "\n"
