"""Trained draft heads: lossless drafting, the EAGLE-3 file layout, refusals, and training end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PROMPTS, ROOT, tiny_llama, tiny_model_folder
from test_sampling import ALPHA, chi2_pvalue, exact_pair_distribution
from transformers import AutoModelForCausalLM

from decoding.api import encode_prompt
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import iter_trace, speculative_generate
from decoding.core.tree import TreeShape
from decoding.drafts import HYBRID_HEAD_K, HYBRID_MIN_MATCH, HybridDraft, NGramDraft, build_draft
from decoding.drafts.head import (
    EagleHead,
    FeatureTap,
    HeadCache,
    HeadConfig,
    HeadDraft,
    HeadKernel,
    fingerprint,
    load_head,
    save_head,
)
from decoding.errors import SpecLensError
from decoding.models.loading import load_model
from decoding.runtime import llama
from decoding.runtime.rowlinear import RowLinear, use_row_kernel
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
from decoding.tools.answers import AnswerStore, shard_records
from decoding.tools.cli import main
from decoding.tools.train_head import (
    TrainConfig,
    answer_prompts,
    conversation_ids,
    draft_vocabulary,
    heldout_split,
    new_head,
    prompt_rows,
    stored_answers,
    train,
    training_sequences,
    training_speed,
    ttt_loss,
    ttt_unroll,
)
from decoding.trace import validate

SHIPPED = ROOT / "assets" / "heads" / "smollm2-135m"


def random_head(target, draft_ids: list[int], seed: int = 0, std: float = 0.3) -> EagleHead:
    """An untrained head for `target` over `draft_ids`, in the target's dtype."""
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.for_target(target.config, len(draft_ids)))
    for p in head.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=std)
    ids = torch.tensor(draft_ids)
    head.d2t.copy_(ids - torch.arange(len(ids)))
    head.t2d[ids] = True
    return head.to(target.dtype).eval()


@pytest.fixture(scope="module")
def trained_tiny(tmp_path_factory):
    """A tiny target on disk and a head trained for it by the real command, in seconds."""
    root = tmp_path_factory.mktemp("head")
    folder = tiny_model_folder(root / "tiny", seed=5)
    prompts = root / "train.jsonl"
    letters = "abcdefghijklmnopqrstuvwxyz"
    rows = [{"prompt": " ".join(letters[(i * 7 + j * 3) % 26] for j in range(6 + i % 5))} for i in range(24)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, work = root / "head-out", root / "work"
    argv = ["train-head", "--target", str(folder), "--prompts", str(prompts), "--out", str(out)]
    argv += [
        "--work",
        str(work),
        "--answer-tokens",
        "24",
        "--epochs",
        "4",
        "--eval-every",
        "22",
        "--draft-vocab",
        "20",
        "--lr",
        "3e-3",
    ]
    assert main(argv) == 0
    return folder, out, work, argv


def f64_target(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval().requires_grad_(False)


def tiny_split(target, work: Path, cfg: TrainConfig) -> tuple[list[dict], list[dict]]:
    """`trained_tiny`'s prompts with their answers (already in `work`'s shards), as training and
    held-out sequences."""
    rows, store = prompt_rows(work.parent / "train.jsonl", 0), AnswerStore(work / "answers")
    assert answer_prompts(target, rows, cfg, store)["answers"] == 0  # every prompt is answered
    rows, answers = stored_answers(target.tokenizer, rows, store.read(fingerprint(target.model)), 1)
    return heldout_split(training_sequences(target.tokenizer, rows, answers, 64), 0.1, 0)


def test_train_head_writes_an_eagle3_folder_and_resumes(trained_tiny, capsys):
    folder, out, work, argv = trained_tiny
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 20
    card = config["speclens"]
    assert card["command"].startswith("python -m decoding train-head") and card["fingerprint"]
    assert card["sequences_trained"] in (22, 44, 66, 88) and len(card["train_top1_by_step"]) == 3
    assert len(card["heldout_top1_by_step"]) == 3  # 2 of the 24 prompts were held out
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) >= {"fc.weight", "midlayer.self_attn.q_proj.weight", "d2t", "t2d"}
    shards = {p.name: p.read_bytes() for p in (work / "answers").iterdir()}
    assert main(argv) == 0  # every stage is found done: nothing is generated or trained again
    assert {p.name: p.read_bytes() for p in (work / "answers").iterdir()} == shards
    assert "train: " not in capsys.readouterr().err
    assert set(card["stage_minutes"]) == {"answers", "training"}
    assert [seen for seen, _ in card["heldout_curve"]] == [22, 44, 66, 88] and card["tokens_trained"] > 88
    readme = (out / "README.md").read_text()
    assert "  - after 88 sequences: " in readme, readme


def test_training_interrupted_midway_resumes_to_the_same_head(trained_tiny, tmp_path):
    """A run stopped after 7 sequences and resumed ends with the head an unbroken run makes."""
    folder, _, work, _ = trained_tiny
    target = load_model(str(folder), "cpu", "float32")
    cfg = TrainConfig(answer_tokens=24, draft_vocab=20, lr=3e-3, max_sequences=15, checkpoint_every=4)
    fit, held = tiny_split(target, work, cfg)
    draft_ids, _ = draft_vocabulary(fit, target.vocab_size, 20)
    heads = []
    for stops in ([None], [7, None]):
        checkpoint = tmp_path / f"{len(stops)}.pt"
        for stop in stops:
            head = new_head(target, draft_ids, 0)
            figures = train(head, target, fit, held, cfg, checkpoint, stop_at=stop)
            assert (figures == {}) == (stop is not None)  # an interrupted run has no head to give yet
        heads.append(head.state_dict())
    assert all(torch.equal(heads[0][name], heads[1][name]) for name in heads[0])
    assert (
        figures["sequences_trained"] == 15
        and torch.load(checkpoint, weights_only=False)["state"]["seen"] == 15
    )


def test_a_stage_ending_where_the_run_already_is_gives_its_best_head_without_training(trained_tiny, tmp_path):
    """`--max-sequences` below what the checkpoint has seen: the best head so far, nothing trained."""
    folder, _, work, _ = trained_tiny
    target = load_model(str(folder), "cpu", "float32")
    cfg = TrainConfig(answer_tokens=24, draft_vocab=20, lr=3e-3, max_sequences=12, eval_every=4)
    fit, held = tiny_split(target, work, cfg)
    draft_ids, _ = draft_vocabulary(fit, target.vocab_size, 20)
    checkpoint = tmp_path / "stages.pt"
    assert train(new_head(target, draft_ids, 0), target, fit, held, cfg, checkpoint, stop_at=9) == {}
    best = torch.load(checkpoint, weights_only=False)["state"]["best"]
    head = new_head(target, draft_ids, 0)
    figures = train(head, target, fit, held, replace(cfg, max_sequences=6), checkpoint)
    assert figures.items() >= best["figures"].items() and figures["sequences_trained"] in (4, 8)
    assert [seen for seen, _ in figures["heldout_curve"]] == [4, 8]
    assert all(torch.equal(head.state_dict()[n], best["head"][n]) for n in best["head"])
    assert torch.load(checkpoint, weights_only=False)["state"]["seen"] == 9  # nothing trained


def test_a_head_started_from_another_keeps_its_layer_and_measures_it_first(trained_tiny, tmp_path, capsys):
    """`--init-from`: the layer is the other head's, the vocabulary and output layer this run's own,
    and the started head is measured before a sequence is trained (and kept if nothing beats it)."""
    folder, out, work, _ = trained_tiny
    target = load_model(str(folder), "cpu", "float32")
    start = load_head(out, target.model, torch.device("cpu"), torch.float32)
    draft_ids = torch.arange(3, 19)  # 16 tokens where the trained head has 20
    head = new_head(target, draft_ids, 1, str(out))
    for name, weight in start.state_dict().items():
        if name.startswith(("fc.", "midlayer.", "norm.")):
            assert torch.equal(head.state_dict()[name], weight), name
    assert torch.equal(head.draft_ids, draft_ids)
    assert torch.equal(head.lm_head.weight, target.model.get_output_embeddings().weight[draft_ids])
    cfg = TrainConfig(answer_tokens=24, draft_vocab=16, max_sequences=2, eval_every=100, init_from=str(out))
    fit, held = tiny_split(target, work, cfg)
    train(head, target, fit, held, cfg, tmp_path / "started.pt")
    assert "after 0 sequences: held-out agreement" in capsys.readouterr().out
    other = EagleHead(replace(HeadConfig.for_target(target.model.config, 16), aux_layers=(0, 1, 1)))
    save_head(other, tmp_path / "other", {})
    with pytest.raises(SpecLensError, match="reads layers"):
        new_head(target, draft_ids, 1, str(tmp_path / "other"))


def test_the_card_gives_the_training_speed_where_it_was_counted():
    assert training_speed({"stage_minutes": {"training": 2.0}, "tokens_trained": 12000}) == (
        "; 12,000 tokens trained on, at 100 tokens/s"
    )
    assert training_speed({"stage_minutes": {"training": 0.0}, "tokens_trained": 12000}) == ""
    assert training_speed({"stage_minutes": {"training": 2.0}}) == ""  # a card written before it was


def test_the_draft_vocabulary_is_the_greedy_answers_most_frequent_tokens():
    data = [
        {"ids": torch.tensor([9, 9, 1, 1, 1, 2]), "answer": torch.arange(6) >= 2, "variant": 0},  # 1 1 1 2
        {"ids": torch.tensor([3, 3, 3]), "answer": torch.ones(3, dtype=torch.bool), "variant": 1},  # sampled
    ]
    ids, coverage = draft_vocabulary(data, 10, 1)
    assert ids.tolist() == [1] and coverage == 0.75


def test_trained_head_is_lossless_for_every_k(trained_tiny):
    folder, out, _, _ = trained_tiny
    target = f64_target(folder)
    head = load_head(out, target, torch.device("cpu"), torch.float64)
    accepted = 0
    for prompt in ([3, 4, 5, 6], [9, 2, 9, 2, 9, 2], [20]):
        ids = torch.tensor([prompt])
        expected = autoregressive_generate(target, ids, max_new_tokens=40).token_ids
        for k in range(1, 9):
            draft = HeadDraft(head, target, "head")
            trace = speculative_generate(target, ids, draft, make_policy("fixed", k), max_new_tokens=40)
            assert trace.output.token_ids == expected, f"k={k} prompt={prompt}"
            validate(trace)
            accepted += trace.totals.accepted
    assert accepted > 0  # the trained head is right sometimes, so the accept path ran too


def test_hybrid_draft_is_lossless_and_names_its_source(trained_tiny):
    """N-gram rounds where the text repeats, head rounds elsewhere; the head, skipping the
    n-gram rounds, still reads every feature it missed and drafts full rounds."""
    folder, out, _, _ = trained_tiny
    target = f64_target(folder)
    head = load_head(out, target, torch.device("cpu"), torch.float64)
    sources = set()
    for prompt in ([3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [9, 2, 9, 2, 9, 2], [20, 21, 5]):
        ids = torch.tensor([prompt])
        expected = autoregressive_generate(target, ids, max_new_tokens=40).token_ids
        for k, min_match, head_k in [(1, 1, 0), (3, 2, 0), (5, 2, 2), (8, 3, 1)]:
            draft = HybridDraft(NGramDraft(), HeadDraft(head, target, "head"), min_match, head_k)
            trace = speculative_generate(target, ids, draft, make_policy("fixed", k), max_new_tokens=40)
            assert trace.output.token_ids == expected, f"k={k} prompt={prompt}"
            validate(trace)
            sources |= {r.source for r in trace.rounds}
            head_rounds = [r for r in trace.rounds if r.source == "head"]
            assert all(r.drafted > 0 for r in head_rounds)  # its features lined up
            assert all(len(r.draft) <= (head_k or k) for r in head_rounds)
    assert sources - {None} == {"ngram", "head"}  # None: a last round with no room to draft


@pytest.mark.parametrize("nodes", [4, 9])
def test_hybrid_trees_are_lossless_and_the_head_reads_the_paths_kept_by_ngram_trees(trained_tiny, nodes):
    """Tree rounds from both sources, chains between them: the head's rounds after an n-gram
    tree read that tree's kept path, so its features still line up and it drafts."""
    folder, out, _, _ = trained_tiny
    target = f64_target(folder)
    head = load_head(out, target, torch.device("cpu"), torch.float64)
    sources = []
    for prompt in ([3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [9, 2, 9, 2, 9, 2], [20, 21, 5]):
        ids = torch.tensor([prompt])
        expected = autoregressive_generate(target, ids, max_new_tokens=40).token_ids
        draft = HybridDraft(NGramDraft(), HeadDraft(head, target, "head"))
        for tree in (TreeShape(nodes, 2), None):  # the same draft: a tree run, then a chain run
            policy = make_policy("fixed", 3)
            trace = speculative_generate(target, ids, draft, policy, max_new_tokens=40, tree=tree)
            assert trace.output.token_ids == expected, f"tree={tree} prompt={prompt}"
            validate(trace)
            if tree is not None:
                sources += [r.source for r in trace.rounds]
                assert all(r.drafted > 0 for r in trace.rounds if r.source == "head")
    assert {"ngram", "head"} <= set(sources)
    switches = sum(a != b for a, b in zip(sources, sources[1:]))
    assert switches >= 2  # the head drafted after n-gram trees, not only before them


def test_training_unrolls_the_head_as_it_drafts(tiny_target):
    """The training-time test's outputs from an origin are the head's drafting from there."""
    head = random_head(tiny_target, list(range(0, 64, 2)), std=0.2)
    ids = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    tap, rows = FeatureTap.on(tiny_target, head.c.aux_layers), {}
    embed = tiny_target.get_input_embeddings().weight
    origins = torch.tensor([0, 2, 5, 6])
    with torch.no_grad():
        with tap.recording(rows):
            tiny_target(ids[None])
        aux = tap.take(rows)
        unrolled = ttt_unroll(head, embed, ids, aux, origins, 3)
        for m, t in enumerate(origins.tolist()):
            cache = HeadCache()  # the real rows up to t, then its own drafts
            out = head.step(embed[ids[1 : t + 2]], head.fc(aux[: t + 1]), cache)[-1:]
            for step in range(3):
                if step:
                    out = head.step(embed[ids[t + step + 1]][None], out, cache)
                torch.testing.assert_close(unrolled[step][m], out[0])


def test_heldout_prompts_are_never_trained_on():
    data = [{"prompt": p, "variant": v} for v in range(3) for p in range(20)]
    fit, held = heldout_split(data, 0.1, seed=0)
    assert len({d["prompt"] for d in held}) == 2 and len(held) == 6  # every variant of 2 prompts
    assert not {d["prompt"] for d in fit} & {d["prompt"] for d in held}
    assert heldout_split(data, 0.0, seed=0) == (data, [])


def test_drafts_equal_a_fresh_recomputation(tiny_target):
    """Each round's draft equals the head run from scratch over the whole sequence so far."""
    head = random_head(tiny_target, list(range(0, 64, 2)), std=0.2)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    trace = speculative_generate(
        tiny_target, ids, HeadDraft(head, tiny_target, "h"), make_policy("fixed", 3), max_new_tokens=30
    )
    tap = FeatureTap.on(tiny_target, head.c.aux_layers)
    embed = tiny_target.get_input_embeddings()
    seq = ids[0].tolist()
    for step in trace.rounds:
        x = torch.tensor([seq])
        rows: dict = {}
        with tap.recording(rows):
            tiny_target(input_ids=x[:, :-1])  # the model's own forward, from scratch
        feats = tap.take(rows)
        cache = HeadCache()
        out = head.step(embed(x[0, 1:]), head.fc(feats), cache)[-1:]
        expected = []
        for _ in range(step.drafted):
            token = head.draft_ids[head.logits(out)[0].argmax()]
            expected.append(int(token))
            out = head.step(embed(token.view(1)), out, cache)
        assert [d.id for d in step.draft] == expected
        seq += [d.id for d in step.draft[: step.n_accepted]]
        seq += [step.emitted.id] if step.emitted else []


def test_rounds_may_hop_threads_and_runs_may_interleave(tiny_target):
    """Gradio asks a generator for each item from whichever worker thread is free,
    and serves several sessions on one model: the head's features must follow its run."""
    head = random_head(tiny_target, list(range(0, 64, 2)), std=0.2)
    prompts = [torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])]

    def run(ids):
        return iter_trace(
            tiny_target, ids, HeadDraft(head, tiny_target, "h"), make_policy("fixed", 3), max_new_tokens=30
        )

    alone = [
        [
            s.draft
            for s in speculative_generate(
                tiny_target,
                ids,
                HeadDraft(head, tiny_target, "h"),
                make_policy("fixed", 3),
                max_new_tokens=30,
            ).rounds
        ]
        for ids in prompts
    ]
    assert all(len(d) == 3 for drafts in alone for d in drafts[:3])  # it drafts, so a lost feature shows
    runs = [run(ids) for ids in prompts]
    last: list = [None, None]
    live = [0, 1]
    while live:
        for i in list(live):
            with ThreadPoolExecutor(1) as pool:  # a new thread for every item
                try:
                    last[i] = pool.submit(next, runs[i]).result()
                except StopIteration:
                    live.remove(i)
    assert [[s.draft for s in t.rounds] for t in last] == alone


def test_drafts_only_from_the_draft_vocabulary(tiny_target):
    vocab = [1, 4, 9, 16, 25, 36, 49]
    head = random_head(tiny_target, vocab)
    trace = speculative_generate(
        tiny_target,
        torch.tensor([[3, 4, 5]]),
        HeadDraft(head, tiny_target, "h"),
        make_policy("fixed", 4),
        max_new_tokens=30,
    )
    assert {d.id for s in trace.rounds for d in s.draft} <= set(vocab)


@pytest.mark.parametrize(
    "sampling", [Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=6, top_p=0.9)]
)
def test_head_sampling_follows_the_target(sampling):
    vocab = 10
    target = tiny_llama(seed=3, layers=4, vocab=vocab, init=0.6)
    head = random_head(target, [0, 1, 2, 3, 5, 6, 8], seed=2, std=0.5)  # three tokens can never be drafted
    prompt = torch.tensor([[3, 5, 3, 5, 3]])
    joint = exact_pair_distribution(target, prompt, sampling)
    counts, accepted, runs = np.zeros((vocab, vocab)), 0, 1000
    draft = HeadDraft(head, target, "h")
    for seed in range(runs):
        s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
        trace = speculative_generate(target, prompt, draft, make_policy("fixed", 2), s, max_new_tokens=2)
        t1, t2 = trace.output.token_ids
        counts[t1, t2] += 1
        accepted += trace.totals.accepted
    assert runs * 0.1 < accepted < runs * 2 * 0.95
    assert chi2_pvalue(counts.ravel(), joint.ravel()) > ALPHA


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=6)])
def test_hybrid_sampling_follows_the_target(sampling):
    vocab = 10
    target = tiny_llama(seed=3, layers=4, vocab=vocab, init=0.6)
    head = random_head(target, [0, 1, 2, 3, 5, 6, 8], seed=2, std=0.5)
    prompt = torch.tensor([[0, 2, 3, 4, 5, 6, 7, 8, 9, 1]])  # "1" never occurred: the head drafts first
    joint = exact_pair_distribution(target, prompt, sampling)
    counts, sources, runs = np.zeros((vocab, vocab)), [], 1000
    draft = HybridDraft(NGramDraft(), HeadDraft(head, target, "h"), min_match=1)
    for seed in range(runs):
        s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
        # A third token gives the second round room to draft: by n-gram when the first
        # new token is one of the prompt's, else by the head.
        trace = speculative_generate(target, prompt, draft, make_policy("fixed", 1), s, max_new_tokens=3)
        t1, t2 = trace.output.token_ids[:2]
        counts[t1, t2] += 1
        sources += [r.source for r in trace.rounds]
    assert min(sources.count("ngram"), sources.count("head")) > runs * 0.02  # both sources drafted
    assert chi2_pvalue(counts.ravel(), joint.ravel()) > ALPHA


def published_layout(target, folder, with_embedding: bool = True):
    """A head as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B ships one (its names, keys and shape
    relations: fc 3h→h, q/k/v from 2h, a reduced lm_head, d2t/t2d), scaled down to `target`."""
    folder.mkdir()
    c = target.config
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": 2048,
        "model_type": "llama",
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": 1,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.28.1",
        "use_cache": True,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": 32,
    }
    (folder / "config.json").write_text(json.dumps(config))
    state = random_head(target, list(range(32)), std=0.1).half().state_dict()
    if with_embedding:
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.half()
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_a_published_eagle3_layout_loads_and_drafts(tiny_target, tmp_path):
    folder = published_layout(tiny_target, tmp_path / "eagle3")
    head = load_head(folder, tiny_target, torch.device("cpu"), torch.float64)
    assert head.c.aux_layers == HeadConfig.for_target(tiny_target.config, 32).aux_layers
    ids = torch.tensor([[7, 8, 9]])
    expected = autoregressive_generate(tiny_target, ids, max_new_tokens=30).token_ids
    trace = speculative_generate(
        tiny_target, ids, HeadDraft(head, tiny_target, "h"), make_policy("fixed", 4), max_new_tokens=30
    )
    assert trace.output.token_ids == expected
    assert trace.totals.proposed > 0


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _corrupt_weights(folder):
    (folder / "pytorch_model.bin").write_bytes(b"not a checkpoint")


def _drop_weight(folder):
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    del state["midlayer.hidden_norm.weight"]
    torch.save(state, folder / "pytorch_model.bin")


BROKEN = {
    "no config": (lambda f: (f / "config.json").unlink(), "no config.json"),
    "bad json": (lambda f: (f / "config.json").write_text("{"), "not valid JSON"),
    "not eagle3": (lambda f: _strip_key(f), "not an EAGLE-3 head"),
    "other hidden size": (lambda f: _edit_config(f, hidden_size=4096), "hidden size 4096"),
    "other vocab": (lambda f: _edit_config(f, vocab_size=128256), "vocabulary of 128256"),
    "other weights": (lambda f: _edit_config(f, speclens={"fingerprint": "0123456789abcdef"}), "fingerprint"),
    "layer out of range": (
        lambda f: _edit_config(f, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 40]}),
        "layers",
    ),
    "garbage values": (lambda f: _edit_config(f, num_attention_heads="many"), "malformed value"),
    "garbage layers": (
        lambda f: _edit_config(f, eagle_config={"eagle_aux_hidden_state_layer_ids": "abc"}),
        "layers abc",
    ),
    "corrupt weights": (_corrupt_weights, "cannot be read"),
    "missing weight": (_drop_weight, "lack 'midlayer.hidden_norm.weight'"),
}


def _strip_key(folder):
    config = json.loads((folder / "config.json").read_text())
    config.pop("draft_vocab_size")
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_or_foreign_head_is_refused_in_one_line(tiny_target, tmp_path, case):
    folder = published_layout(tiny_target, tmp_path / "eagle3")
    breaks, words = BROKEN[case]
    breaks(folder)
    with pytest.raises(SpecLensError) as err:
        load_head(folder, tiny_target, torch.device("cpu"), torch.float64)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_missing_head_folder_on_the_command_line(tmp_path):
    folder = tiny_model_folder(tmp_path / "tiny")
    cmd = [
        sys.executable,
        "-m",
        "decoding",
        "generate",
        "--target",
        str(folder),
        "--draft",
        f"head:{tmp_path}/nope",
    ]
    run = subprocess.run([*cmd, "--prompt", "a b c"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"error: no head folder at '{tmp_path}/nope'"]


def test_the_shipped_head_fits_in_a_space_and_names_its_command():
    files = list(SHIPPED.iterdir())
    assert all(f.stat().st_size < 10_000_000 for f in files), [(f.name, f.stat().st_size) for f in files]
    card = json.loads((SHIPPED / "config.json").read_text())["speclens"]
    assert card["command"].startswith("python -m decoding train-head --target smollm2-135m")
    prompts = card["command"].split("--prompts ")[1].split()[0]
    assert "dev" not in Path(prompts).name and (SHIPPED / "README.md").is_file()


def test_the_shipped_head_is_lossless_on_smollm2(smol):
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    accepted = 0
    for row in (rows[0], rows[-1]):
        ids = encode_prompt(smol, row["prompt"], chat=True)
        expected = autoregressive_generate(smol.model, ids, max_new_tokens=32).token_ids
        for k in (2, 8):
            draft = build_draft("head", smol)
            assert isinstance(draft.head.lm_head, RowLinear) == smol.row_kernel  # the target's kernel
            assert not getattr(draft.head.lm_head, "uses_panels", False)  # one row at a time: its own rows
            trace = speculative_generate(smol.model, ids, draft, make_policy("fixed", k), max_new_tokens=32)
            assert trace.output.token_ids == expected, f"k={k}"
            accepted += trace.totals.accepted
    assert accepted > 10  # a trained head keeps some of its drafts


def test_hybrid_specs_name_their_threshold_and_refuse_nonsense(smol):
    hybrid = build_draft("ngram+head", smol)
    assert (hybrid.min_match, hybrid.head_k, hybrid.name) == (HYBRID_MIN_MATCH, HYBRID_HEAD_K, "ngram+head")
    draft = build_draft("ngram+head@3", smol)
    assert (draft.min_match, draft.name) == (3, "ngram+head@3")
    draft = build_draft("ngram+head@1/1", smol)
    assert (draft.min_match, draft.head_k, draft.name) == (1, 1, "ngram+head@1/1")
    assert build_draft("ngram+head@1/0", smol).head_k == 0  # no cap: the round's k
    for bad in ("ngram+head@0", "ngram+head@x", "ngram+heads", "ngram+head@1/x", "ngram+head@1/99"):
        with pytest.raises(SpecLensError, match="ngram\\+head@M"):
            build_draft(bad, smol)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_model_folder(folder: Path) -> Path:
    """A tiny model whose tokenizer has a chat template (its markers are unknown words to it)."""
    tiny_model_folder(folder, seed=5)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": CHAT_TEMPLATE}))
    return folder


def test_a_conversation_trains_on_what_its_assistant_wrote(tmp_path):
    target = load_model(str(chat_model_folder(tmp_path / "tiny")), "cpu", "float32")
    tok = target.tokenizer
    messages = [
        {"role": "user", "content": "a b c"},
        {"role": "assistant", "content": "d e"},
        {"role": "user", "content": "f"},
        {"role": "assistant", "content": "g h i"},
    ]
    ids, answer = conversation_ids(tok, messages)
    words = tok.decode(ids[answer]).split()  # the end-of-turn marker is unknown words to this tokenizer
    assert [w for w in words if w != "<unk>"] == ["d", "e", "g", "h", "i"] and words[-1] == "<unk>"
    rows = [{"prompt": "a b c", "messages": messages}, {"prompt": "z"}]
    answers = [{"prompt": 1, "variant": 0, "ids": tok("z y x")["input_ids"], "prompt_len": 1}]
    data = training_sequences(tok, rows, answers, max_len=8)
    windows = [d for d in data if d["prompt"] == 0]
    starts = range(0, len(ids) - 1, 8)
    expected = [ids[s : s + 8] for s in starts if answer[s : s + 8].any()]
    assert len(expected) < len(starts)  # the opening window holds no answer: it is left out
    assert len(windows) == len(expected) and all(torch.equal(w["ids"], e) for w, e in zip(windows, expected))


def test_a_label_the_draft_vocabulary_cannot_reach_is_left_out_of_the_loss_and_counted_wrong():
    target = tiny_llama(seed=3, vocab=32).float()
    head = random_head(target, list(range(16))).float().train()
    embed = target.get_input_embeddings().weight.detach()
    n = 12
    d = {
        "ids": torch.arange(n) % 16,
        "answer": torch.ones(n, dtype=torch.bool),
        "aux": torch.randn(n, 3 * 32),
        "final": torch.randn(n, 32),
    }
    rows = target.get_output_embeddings().weight.detach()[:16]
    everywhere = d | {"top": torch.zeros(n, dtype=torch.long)}  # token 0: in the draft vocabulary
    nowhere = d | {"top": torch.full((n,), 20)}  # token 20: outside it
    loss, figures = ttt_loss(head, embed, everywhere, rows, 2, 0.0)
    assert loss.item() > 0 and figures[0][1] == n - 1
    loss, figures = ttt_loss(head, embed, nowhere, rows, 2, 0.0)
    assert loss.item() == 0 and figures[0] == (0, n - 1)


def test_train_head_takes_conversations_and_prompts_in_one_file(tmp_path):
    folder = chat_model_folder(tmp_path / "tiny")
    letters = "abcdefghijklmnopqrstuvwxyz"
    rows = [{"prompt": f"{letters[i]} {letters[i + 1]}"} for i in range(4)]
    for i in range(4):
        turns = [
            " ".join(letters[(i + j) % 26] for j in range(5)),
            " ".join(letters[(i * 3 + j) % 26] for j in range(9)),
        ]
        rows.append(
            {
                "prompt": turns[0],
                "messages": [
                    {"role": "user", "content": turns[0]},
                    {"role": "assistant", "content": turns[1]},
                ],
            }
        )
    prompts = tmp_path / "train.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, work = tmp_path / "out", tmp_path / "work"
    argv = [
        "train-head",
        "--target",
        str(folder),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--work",
        str(work),
    ]
    argv += ["--answer-tokens", "6", "--epochs", "1", "--draft-vocab", "20", "--holdout", "0", "--steps", "2"]
    assert main(argv) == 0
    answered = shard_records(work / "answers" / "answers-00000.jsonl.gz")
    assert sorted(r["prompt"] for r in answered) == [r["prompt"] for r in rows[:4]]  # conversations get none
    card = json.loads((out / "config.json").read_text())["speclens"]
    assert card["sequences_trained"] == 8
    assert card["data"].startswith(
        "train.jsonl: 4 conversations as written (4 windows of up to 768 tokens) and 4 prompts with the "
        "target's own answers of up to 6 tokens (greedy: self-distillation); "
    )


def _drafted(trace) -> tuple[list, list]:
    """Each round's drafted tokens (a tree's every node with its parent), and their draft probabilities."""
    tokens = [
        [(n.id, n.parent) for n in r.tree] if r.tree is not None else [d.id for d in r.draft]
        for r in trace.rounds
    ]
    qs = [[n.q for n in (r.tree if r.tree is not None else r.draft)] for r in trace.rounds]
    return tokens, qs


def _assert_drafts_alike(target, ids, kernel: HeadDraft, eager: HeadDraft, tokens: int) -> int:
    """Greedy chains of k = 3 and 16-node trees: the same drafts from both; the number of rounds."""
    rounds = 0
    for tree in (None, TreeShape(16, 3)):
        runs = [
            speculative_generate(target, ids, d, make_policy("fixed", 3), max_new_tokens=tokens, tree=tree)
            for d in (kernel, eager)
        ]
        (drafts, qs), (expected, expected_qs) = (_drafted(t) for t in runs)
        assert drafts == expected, f"tree={tree}"
        assert np.allclose(sum(qs, []), sum(expected_qs, []), atol=1e-5)
        rounds += len(runs[0].rounds)
    return rounds


@pytest.mark.parametrize("hidden", [32, 64])
@pytest.mark.parametrize("saved_in_half", [False, True])
def test_the_head_drafts_through_the_layer_kernel_what_its_modules_draft(hidden, saved_in_half):
    """A tiny float32 target in the default CPU mode and a head built from its config: with float32
    weights, or weights float16 holds (as a saved head's), which the kernel then reads as float16."""
    target = tiny_llama(seed=0, init=0.3, hidden=hidden).to(torch.float32)
    assert use_row_kernel(target) and llama.use_layer_kernel(target)
    head = random_head(target, list(range(0, 64, 2)), std=0.2)
    if saved_in_half:
        head = head.half().float()
    assert HeadDraft(head, target, "h").stepper is head  # not the row kernel's linears: its modules
    use_row_kernel(head, panels=False)  # as build_draft does on the kernel path
    kernel = HeadDraft(head, target, "h")
    assert isinstance(kernel.stepper, HeadKernel) and kernel.stepper.half == saved_in_half
    for prompt in ([5, 6, 7, 8, 9], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]):
        eager = HeadDraft(head, target, "h", kernel=False)
        _assert_drafts_alike(target, torch.tensor([prompt]), kernel, eager, 40)


def test_the_head_keeps_its_modules_off_the_cpu_fast_path(tiny_target):
    head = random_head(tiny_target, list(range(0, 64, 2)))  # float64: no kernel
    assert HeadDraft(head, tiny_target, "h").stepper is head


def test_the_shipped_head_drafts_through_the_layer_kernel_what_its_modules_draft(smol):
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    rounds = 0
    for row in (rows[0], rows[-1]):
        ids = encode_prompt(smol, row["prompt"], chat=True)
        kernel = build_draft("head", smol)
        assert smol.row_kernel and isinstance(kernel.stepper, HeadKernel)  # chosen in the default CPU mode
        assert kernel.stepper.half  # saved in float16: read as float16
        eager = HeadDraft(kernel.head, smol.model, "head", kernel=False)
        rounds += _assert_drafts_alike(smol.model, ids, kernel, eager, 40)
    assert rounds > 20


def test_a_stage_stopped_by_kill_still_adds_up_its_minutes(tmp_path):
    """Long runs are stopped with `kill`; the minutes they ran must still reach stages.json."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from decoding.tools.train_head import stage_clock\n"
        "with stage_clock(Path(sys.argv[1]), 'training'):\n"
        "    print('in', flush=True)\n"
        "    time.sleep(60)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert run.stdout.readline() == "in\n"
    run.terminate()
    assert run.wait(timeout=30) == 143
    assert "training" in json.loads((tmp_path / "stages.json").read_text())
