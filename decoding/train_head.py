"""Training a draft head by self-distillation, in three resumable stages.

1. answers: the target's own answers to the training prompts, generated in
   batches (greedy, plus `sampled` answers per prompt at temperature 0.7);
2. features: one target pass per prompt + answer, keeping the three tapped
   layers and the target's final hidden state (float16, in the work folder);
3. training: EAGLE-3's training-time test. The head is unrolled `steps`
   steps, each step reading the previous step's own output feature, exactly
   as it drafts; the loss is the cross-entropy against the target's
   distribution over the draft vocabulary at every position. Why EAGLE-3's
   and not EAGLE-1's feature loss: drafting k tokens feeds the head its own
   features from the second token on, and training on them is what keeps
   acceptance up at positions 2 and 3.

Each stage saves what it made in the work folder and is skipped when it is
already there, so an interrupted run resumes; training saves a checkpoint
every epoch. Nothing here is used at decoding time.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from .bench import machine
from .errors import SpecLensError
from .heads import EagleHead, FeatureTap, HeadConfig, fingerprint, save_head
from .models import LoadedModel


@dataclass
class TrainConfig:
    answer_tokens: int = 128
    sampled: int = 0  # sampled answers per prompt, besides the greedy one
    batch_size: int = 16
    draft_vocab: int = 8192
    steps: int = 3  # training-time-test depth
    epochs: int = 5
    lr: float = 1e-3
    prompt_weight: float = 0.2  # loss weight of prompt positions; the answer's count 1
    max_len: int = 1280  # tokens of prompt + answer kept (the end of longer ones)
    seed: int = 0
    limit: int = 0  # prompts used, 0 = all (CI's short run)


def read_prompts(path: Path, limit: int = 0) -> list[str]:
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise SpecLensError(f"cannot read training prompts from {path}: {exc}") from None
    prompts = [r["prompt"] for r in rows if isinstance(r, dict) and isinstance(r.get("prompt"), str)]
    if not prompts:
        raise SpecLensError(f"{path} has no rows with a 'prompt'")
    return prompts[:limit] if limit else prompts


def chat_text(tokenizer, prompt: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
    return prompt


# --- stage 1: answers ---------------------------------------------------------


@torch.inference_mode()
def generate_answers(
    target: LoadedModel, prompts: list[str], cfg: TrainConfig, path: Path
) -> list[list[int]]:
    """Token ids of prompt + answer, one list per (prompt, variant); appended to `path` as made."""
    done = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    have = {(r["prompt"], r["variant"]) for r in done}
    tok = target.tokenizer
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    pad = tok.pad_token_id
    jobs = [(p, v) for v in range(1 + cfg.sampled) for p in range(len(prompts)) if (p, v) not in have]
    # Similar lengths together, so a batch pads little.
    jobs.sort(key=lambda j: (j[1], len(prompts[j[0]])))
    bar = tqdm(total=len(jobs), desc="answers", unit="answer", disable=not jobs)
    with path.open("a") as out:
        for i in range(0, len(jobs), cfg.batch_size):
            batch = jobs[i : i + cfg.batch_size]
            variant = batch[0][1]
            texts = [chat_text(tok, prompts[p]) for p, _ in batch]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
            torch.manual_seed(cfg.seed * 1000 + variant * 100 + i)
            sample = dict(do_sample=True, temperature=0.7) if variant else dict(do_sample=False)
            ids = target.model.generate(**enc, max_new_tokens=cfg.answer_tokens, pad_token_id=pad, **sample)
            for row, mask, (p, v) in zip(ids, enc.attention_mask, batch):
                prompt_len = int(mask.sum())
                width = enc.input_ids.shape[1]
                answer = row[width:].tolist()
                if pad in answer and pad in _eos(tok):  # generate pads finished rows with EOS
                    answer = answer[: answer.index(pad) + 1]
                seq = row[width - prompt_len : width].tolist() + answer
                done.append({"prompt": p, "variant": v, "ids": seq})
                out.write(json.dumps(done[-1]) + "\n")
            out.flush()
            bar.update(len(batch))
    bar.close()
    return sorted(done, key=lambda r: (r["variant"], r["prompt"]))


def _eos(tok) -> set[int]:
    return {tok.eos_token_id} if tok.eos_token_id is not None else set()


# --- stage 2: features --------------------------------------------------------


@torch.inference_mode()
def extract_features(
    target: LoadedModel, sequences: list[list[int]], layers: tuple[int, ...], cfg: TrainConfig
):
    """Per sequence: ids, the tapped features [T, 3h] and the final hidden state [T, h], in float16."""
    tap = FeatureTap.on(target.model, layers)
    data = []
    for ids in tqdm(sequences, desc="features", unit="seq"):
        ids = ids[-cfg.max_len :]
        x = torch.tensor([ids], device=target.device)
        rows: dict = {}
        with tap.recording(rows):
            final = target.model.model(input_ids=x).last_hidden_state[0]
        aux = tap.take(rows)
        data.append({"ids": x[0].cpu(), "aux": aux.half().cpu(), "final": final.half().cpu()})
    return data


def draft_vocabulary(data: list[dict], lm_head: torch.Tensor, size: int) -> tuple[torch.Tensor, float]:
    """The `size` tokens the target predicts most often, sorted by id, and the share of predictions they cover."""
    counts = torch.zeros(lm_head.shape[0], dtype=torch.long)
    for d in data:
        top = (d["final"].float() @ lm_head.float().T).argmax(-1)
        counts += torch.bincount(top, minlength=lm_head.shape[0])
    size = min(size, lm_head.shape[0])
    chosen = torch.topk(counts, size).indices.sort().values
    return chosen, float(counts[chosen].sum() / counts.sum())


# --- stage 3: training --------------------------------------------------------


def new_head(target: LoadedModel, draft_ids: torch.Tensor, seed: int) -> EagleHead:
    """A head with EAGLE-3's shape for the target, its output layer started from the target's rows."""
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
    return head


def ttt_loss(
    head: EagleHead, embed: torch.Tensor, d: dict, label_rows: torch.Tensor, steps: int, prompt_weight: float
):
    """Training-time test on one sequence: (loss, [top-1 agreement per step]).

    Origin t reads (feature t, token t+1) at step 1 and (its own step j-1
    output, token t+j) at step j, and predicts the target's distribution at
    position t+j. Its queries see step 1's rows up to t (the target's real
    features) and its own later steps: what the head sees when it drafts.
    """
    ids, aux, final = d["ids"], d["aux"].float(), d["final"].float()
    n = ids.shape[0] - 1  # origins 0 .. T-2
    if n < 1:
        return None, []
    attn = head.midlayer.self_attn
    c = head.c
    scale = 1.0 / math.sqrt(c.head_dim)
    with torch.no_grad():
        target_logits = final @ label_rows.T  # [T, draft vocab]
        target_probs = target_logits.softmax(-1)
        target_top = target_logits.argmax(-1)
    origins = torch.arange(n)
    # Drafting happens in answers: a label predicting an answer token weighs 1, one in the prompt less.
    weight = torch.where(torch.arange(n + 1) >= d["prompt_len"] - 1, 1.0, prompt_weight)
    feature = head.fc(aux[:n])
    keys, values = [], []
    loss = torch.zeros(())
    agree = []
    for j in range(1, steps + 1):
        valid = origins + j <= n  # the input token t+j exists
        tok_pos = (origins + j).clamp(max=n)
        emb = embed[ids[tok_pos]]
        q, k, v = attn.project(head.midlayer.attention_input(emb, feature), origins + j - 1)
        q = q * scale
        keys.append(attn.expand(k))
        values.append(attn.expand(v))
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        s1 = (q @ keys[0].transpose(1, 2)).masked_fill(~causal, float("-inf"))  # [H, n, n]
        diag = [(q * kk).sum(-1, keepdim=True) for kk in keys[1:]]  # own rows of later steps
        w = torch.cat([s1, *diag], dim=-1).softmax(-1)
        attended = w[..., :n] @ values[0]
        for i, vv in enumerate(values[1:]):
            attended = attended + w[..., n + i : n + i + 1] * vv
        feature = head.midlayer.finish(feature, attended)
        logp = head.logits(feature).log_softmax(-1)
        label = tok_pos  # the target's distribution at position t+j
        per_row = -(target_probs[label] * logp).sum(-1) * weight[label]
        loss = loss + (0.8 ** (j - 1)) * per_row[valid].sum() / weight[label][valid].sum()
        agree.append(float((logp.argmax(-1) == target_top[label])[valid].float().mean()))
    return loss, agree


def train(head: EagleHead, target: LoadedModel, data: list[dict], cfg: TrainConfig, checkpoint: Path) -> dict:
    """Trains in place, resuming from `checkpoint`; returns the last epoch's figures."""
    embed = target.model.get_input_embeddings().weight.detach().float().cpu()
    label_rows = target.model.get_output_embeddings().weight.detach().float().cpu()[head.draft_ids]
    params = [p for n, p in head.named_parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    total = cfg.epochs * len(data)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / total)
    )
    epoch0, figures = 0, {}
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        epoch0, figures = state["epoch"], state["figures"]
    rng = random.Random(cfg.seed)
    orders = [rng.sample(range(len(data)), len(data)) for _ in range(cfg.epochs)]
    for epoch in range(epoch0, cfg.epochs):
        head.train()
        sums, count = [0.0] * cfg.steps, 0
        bar = tqdm(orders[epoch], desc=f"train {epoch + 1}/{cfg.epochs}", unit="seq")
        for i in bar:
            loss, agree = ttt_loss(head, embed, data[i], label_rows, cfg.steps, cfg.prompt_weight)
            if loss is None:
                continue
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            sched.step()
            sums = [s + a for s, a in zip(sums, agree)]
            count += 1
            bar.set_postfix(loss=f"{loss.item():.2f}", top1=" ".join(f"{s / count:.2f}" for s in sums))
        figures = {"epoch": epoch + 1, "train_top1_by_step": [round(s / max(count, 1), 4) for s in sums]}
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "epoch": epoch + 1, "figures": figures}, checkpoint)  # fmt: skip
    head.eval()
    return figures


def train_head(
    target: LoadedModel, prompts_path: Path, out: Path, work: Path, cfg: TrainConfig, command: str
) -> dict:
    """The whole run: answers, features, training, then the head folder with its card."""
    started = time.time()
    if "dev" in prompts_path.name:
        raise SpecLensError("refusing to train on a dev file: the dev prompts are what heads are measured on")
    prompts = read_prompts(prompts_path, cfg.limit)
    work.mkdir(parents=True, exist_ok=True)
    # Everything but the epoch count: a later run with more epochs trains on from the checkpoint.
    same = asdict(cfg) | {"prompts": str(prompts_path), "target": target.name, "epochs": None}
    settings = json.dumps(same, sort_keys=True)
    stamp = work / "settings.json"
    if stamp.exists() and stamp.read_text() != settings:
        raise SpecLensError(f"{work} holds a run with other settings: remove it or pass another --work")
    stamp.write_text(settings)
    answers = generate_answers(target, prompts, cfg, work / "answers.jsonl")
    sequences = [r["ids"] for r in answers]
    layers = HeadConfig.for_target(target.model.config, cfg.draft_vocab).aux_layers
    feats_path = work / "features.pt"
    if feats_path.exists():
        data = torch.load(feats_path, weights_only=False)
    else:
        data = extract_features(target, sequences, layers, cfg)
        torch.save(data, feats_path)
    for d, r in zip(data, answers):  # where the answer starts, in the (maybe cut) sequence
        prompt = target.tokenizer(chat_text(target.tokenizer, prompts[r["prompt"]]), add_special_tokens=False)
        d["prompt_len"] = len(prompt["input_ids"]) - (len(r["ids"]) - d["ids"].shape[0])
    lm_head = target.model.get_output_embeddings().weight.detach().cpu()
    draft_ids, coverage = draft_vocabulary(data, lm_head, cfg.draft_vocab)
    head = new_head(target, draft_ids, cfg.seed)
    figures = train(head, target, data, cfg, work / "checkpoint.pt")
    tokens = sum(int(d["ids"].shape[0]) for d in data)
    card = {
        "target": target.name,
        "fingerprint": fingerprint(target.model),
        "command": command,
        "data": f"{prompts_path.name}: {len(prompts)} prompts, {len(sequences)} sequences, {tokens} tokens",
        "date": _dt.date.today().isoformat(),
        "machine": machine(),
        "training_minutes": round((time.time() - started) / 60, 1),
        "draft_vocab_coverage": round(coverage, 4),
        "settings": asdict(cfg),
        **figures,
    }
    save_head(head, out, card)
    (out / "README.md").write_text(head_card(card))
    return card


def head_card(card: dict) -> str:
    """The head's README: what it drafts for, how it was made, and where it is measured."""
    top1 = ", ".join(f"{a:.2f}" for a in card.get("train_top1_by_step", []))
    return f"""# EAGLE-3 draft head for {card["target"]}, trained by SpecLens

- Target: `{card["target"]}`, weights fingerprint `{card["fingerprint"]}` (a head is refused by any other weights)
- Layout: EAGLE-3 (`fc`, `midlayer`, `norm`, `lm_head` over a {card["settings"]["draft_vocab"]}-token draft
  vocabulary covering {card["draft_vocab_coverage"]:.1%} of the target's predictions on the training data, `d2t`, `t2d`)
- Data: {card["data"]} (the target's own greedy answers: self-distillation)
- Training: EAGLE-3 training-time test over {card["settings"]["steps"]} steps, {card["settings"]["epochs"]} epochs,
  {card["training_minutes"]} minutes on {card["machine"]}, {card["date"]}
- Agreement with the target on the training data, by draft step: {top1}
- Command:

      {card["command"]}

Acceptance and speed on the dev prompts (never trained on) are measured by
`python -m decoding bench --draft head`; see `benchmarks/cpu-head-f32/summary.md`.
"""
