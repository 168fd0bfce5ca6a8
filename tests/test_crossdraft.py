"""Drafts with another tokenizer: lossless, greedy and sampled, with both sides in the trace.

Tiny models with tokenizers built here (a character-level target, a word-level
draft, a draft whose vocabulary is the target's in another order), and the real
offline pair: Gemma-3-270M checked, SmolLM2-135M drafting.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import ROOT, first_of, tiny_llama
from test_sampling import ALPHA, chi2_pvalue, exact_pair_distribution
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from decoding import api
from decoding.api import RunConfig, token_texts
from decoding.core.plain import autoregressive_generate
from decoding.core.speculative import speculative_generate
from decoding.drafts.cross_tokenizer import CrossTokenizerDraft, shared_vocabulary
from decoding.errors import SpecLensError, TraceError
from decoding.models import LoadedModel
from decoding.settings.policies import make_policy
from decoding.settings.sampling import Sampling
from decoding.trace import Trace, validate
from visualize.explain import explain_round, explain_round_markdown
from visualize.timeline import timeline_html

CHARS = ["<eos>", " ", ".", *"abcdefghij"]  # every character the draft's words hold
WORDS = ["<eos>", " ", *"abcdefghij", " a", " be", " cab", " dig", "jig", " head", "fad", " deaf", "."]


def tokenizer(vocab: list[str], pattern: str, bos: str | None = None) -> PreTrainedTokenizerFast:
    """A tokenizer that cuts text by `pattern` and looks each piece up in `vocab`."""
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated")
    tok.decoder = decoders.Fuse()
    extra = {}
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, vocab.index(bos))]
        )
        extra["bos_token"] = bos
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", **extra)


def chars() -> PreTrainedTokenizerFast:
    return tokenizer(CHARS, ".")


def words(bos: str | None = None) -> PreTrainedTokenizerFast:
    longest_first = "|".join(sorted(WORDS[1:], key=len, reverse=True))
    return tokenizer([*WORDS, bos] if bos else WORDS, longest_first.replace(".", r"\."), bos)


def loaded(model, tok, name: str) -> LoadedModel:
    return LoadedModel(name, name, model, tok, torch.device("cpu"), model.dtype)


def retokenized(model, vocab: list[str], noise: float = 0.0):
    """A character-level target re-indexed for `vocab`: a token that is one of its characters
    reads and writes that character's rows (plus `noise`); any other gets random rows."""
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(11)

    def rows(weight: torch.Tensor, scale: float) -> torch.Tensor:
        out = weight.std() * torch.randn(len(vocab), weight.shape[1], generator=gen, dtype=weight.dtype)
        for i, token in enumerate(vocab):
            if token in CHARS:
                out[i] = weight[CHARS.index(token)] + scale * out[i]
        return out

    twin.model.embed_tokens = torch.nn.Embedding.from_pretrained(rows(model.model.embed_tokens.weight, 0.0))
    twin.lm_head = torch.nn.Linear(model.config.hidden_size, len(vocab), bias=False, dtype=model.dtype)
    twin.lm_head.weight = torch.nn.Parameter(rows(model.lm_head.weight, noise), requires_grad=False)
    twin.config.vocab_size = len(vocab)
    return twin.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def char_target():
    return tiny_llama(seed=5, vocab=len(CHARS), init=0.6)


def prompt_ids(tok, text: str) -> torch.Tensor:
    return torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_a_reordered_vocabulary_drafts_every_token_right(char_target, k):
    """The target itself with its vocabulary in another order: different ids, the same
    text, so every drafted token must be accepted and the output stays the target's."""
    reordered = CHARS[::-1]
    tok, twin_tok = chars(), tokenizer(reordered, ".")
    twin = loaded(retokenized(char_target, reordered), twin_tok, "twin")
    draft = CrossTokenizerDraft(twin, tok, len(CHARS), "twin")
    ids = prompt_ids(tok, "a bad cab")
    plain = autoregressive_generate(char_target, ids, max_new_tokens=30)
    trace = speculative_generate(char_target, ids, draft, make_policy("fixed", k), max_new_tokens=30)
    validate(trace)
    assert trace.output.token_ids == plain.token_ids
    assert trace.totals.accepted == trace.totals.proposed > 0
    assert all(
        r.translation.sources == [[j] for j in range(r.drafted)] for r in trace.rounds if r.translation
    )


@pytest.mark.parametrize("k", [1, 2, 4, 6])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_word_level_draft_for_a_character_level_target_is_lossless(char_target, k, seed):
    tok, draft_tok = chars(), words()
    draft_model = tiny_llama(seed=seed, layers=2, vocab=len(WORDS), init=0.6)
    draft = CrossTokenizerDraft(loaded(draft_model, draft_tok, "words"), tok, len(CHARS), "words")
    ids = prompt_ids(tok, "a bad cab dig jig")
    plain = autoregressive_generate(char_target, ids, max_new_tokens=40)
    policy = make_policy("fixed", k)
    trace = speculative_generate(
        char_target, ids, draft, policy, max_new_tokens=40, token_text=token_texts(tok)
    )
    validate(trace)
    assert trace.output.token_ids == plain.token_ids
    for r in trace.rounds:
        if (t := r.translation) is None:  # the last round, with no tokens left to draft
            continue
        # Each drafted target character came from the draft word that holds it.
        for tok_j, src in zip(r.draft, t.sources):
            if tok_j.text.strip():
                assert src and tok_j.text in "".join(t.texts[i] for i in src)


def test_the_heuristic_counts_target_tokens(char_target):
    """k is the number of target tokens checked, however many draft tokens made them."""
    tok = chars()
    draft = CrossTokenizerDraft(
        loaded(tiny_llama(seed=2, layers=2, vocab=len(WORDS), init=0.6), words(), "words"),
        tok,
        len(CHARS),
        "w",
    )
    ids = prompt_ids(tok, "a bad cab dig jig")
    policy = make_policy("heuristic", 3)
    trace = speculative_generate(char_target, ids, draft, policy, max_new_tokens=60)
    expected = make_policy("heuristic", 3)
    fewer_draft_tokens = 0
    for r in trace.rounds[:-1]:  # the last round is cut to the tokens left
        assert r.drafted == expected.next_k()
        fewer_draft_tokens += len(r.translation.ids) < r.drafted
        expected.update(r.n_accepted, r.drafted)
    assert fewer_draft_tokens > 0


def test_the_draft_reads_its_own_bos_once_and_not_the_targets():
    target_tok = tokenizer([*CHARS, "<bos>"], ".", bos="<bos>")
    draft_tok = words(bos="<s>")
    model = tiny_llama(seed=1, layers=1, vocab=len(WORDS) + 1)
    draft = CrossTokenizerDraft(loaded(model, draft_tok, "w"), target_tok, len(CHARS) + 1, "w")
    seq = torch.tensor([target_tok(" cab")["input_ids"]])
    assert seq[0, 0] == target_tok.bos_token_id
    assert draft.context(seq) == [draft_tok.bos_token_id, WORDS.index(" cab")]


def test_the_shared_vocabulary_is_the_tokens_with_the_same_text():
    table = shared_vocabulary(words(), chars(), len(CHARS)).tolist()
    for i, word in enumerate(WORDS):
        if word in CHARS and word != "<eos>":
            assert CHARS[table[i]] == word
        elif word not in ("<eos>",):
            assert table[i] == -1, word
    assert table[WORDS.index("<eos>")] == CHARS.index("<eos>")


def test_sampling_through_the_shared_vocabulary_follows_the_target():
    """Pairs of tokens drawn with a word-level draft (only its single characters are
    shared with the target: it may draft nothing else) follow the target's own distribution."""
    # One setting: tests/test_sampling.py covers each sampling setting's rule; this is the mapping.
    sampling = Sampling(temperature=0.7, top_k=6, top_p=0.9)
    target = tiny_llama(seed=3, layers=2, vocab=len(CHARS), init=0.6)
    tok, draft_tok = chars(), words()
    draft_model = retokenized(target, WORDS, noise=0.5)
    prompt = prompt_ids(tok, "cab bad")
    joint = exact_pair_distribution(target, prompt, sampling)
    counts = np.zeros_like(joint)
    accepted = 0
    runs = 2500
    draft = CrossTokenizerDraft(loaded(draft_model, draft_tok, "w"), tok, len(CHARS), "w")
    for seed in range(runs):  # the loop resets the draft for each run
        s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
        trace = speculative_generate(target, prompt, draft, make_policy("fixed", 2), s, max_new_tokens=2)
        t1, t2 = trace.output.token_ids
        counts[t1, t2] += 1
        accepted += trace.totals.accepted
    assert runs * 0.1 < accepted < runs * 2 * 0.95  # both the accept and the refuse paths ran
    assert chi2_pvalue(counts.ravel(), joint.ravel()) > ALPHA


def test_a_draft_folder_with_another_tokenizer_drafts_through_text(tmp_path, char_target):
    target_folder, draft_folder = tmp_path / "chars", tmp_path / "words"
    chars().save_pretrained(target_folder)
    copy.deepcopy(char_target).float().save_pretrained(target_folder)
    words().save_pretrained(draft_folder)
    tiny_llama(seed=1, layers=2, vocab=len(WORDS)).to(torch.float32).save_pretrained(draft_folder)
    config = RunConfig(target=str(target_folder), draft=str(draft_folder), prompt="a bad cab", chat=False)
    run = api.prepare(replace(config, max_new_tokens=12))
    assert isinstance(run.draft, CrossTokenizerDraft) and run.draft.kind == "cross"
    validate(api.speculative(run))
    with pytest.raises(SpecLensError, match="cross draft cannot draft a token tree"):
        api.prepare(replace(config, tree_nodes=4))


EXAMPLE = ROOT / "assets" / "traces" / "math_reasoning-gemma-smollm2-greedy.json"


def test_the_example_trace_shows_both_tokenizers():
    """The committed Gemma-3 ← SmolLM2 run: each chip names the draft tokens it came from,
    each round's label and sentence say so."""
    trace = Trace.load(EXAMPLE)
    validate(trace)
    assert trace.meta.draft_kind == "cross" and trace.output.token_ids == trace.baseline.token_ids
    html = timeline_html(trace)
    assert "re-encoded for the target" in html and "from 3 draft tokens" in html
    rnd = next(r for r in trace.rounds if r.drafted == 3)
    assert "another tokenizer" in explain_round(rnd, 0, True)
    assert "of its own" in explain_round_markdown(rnd, 0, True)


def test_a_broken_translation_is_refused():
    data = Trace.load(EXAMPLE).to_dict()  # today's field names, whatever version the file is
    rnd = next(r for r in data["rounds"] if r["drafted"])
    rnd["translation"]["sources"][0] = [99]
    with pytest.raises(TraceError, match="indices of the draft's own tokens"):
        validate(Trace.from_dict(data))
    rnd["translation"]["sources"] = []
    with pytest.raises(TraceError, match="sources for 0 tokens"):
        validate(Trace.from_dict(data))


# -- the real offline pair ----------------------------------------------------------


@pytest.mark.parametrize("category", ["math_reasoning", "qa"])
def test_gemma_checks_what_smollm2_drafts(gemma, smol, specbench, category):
    prompt = first_of(specbench, category)["prompt"]
    config = RunConfig(target="gemma3-270m", draft="smollm2-135m", k=3, prompt=prompt, max_new_tokens=32)
    run = api.prepare(config)
    assert run.draft.kind == "cross"
    trace = api.speculative(run)
    validate(trace)
    assert trace.output.token_ids == api.plain_baseline(config).token_ids
    assert trace.totals.accepted > 0
    # Gemma's <bos> opens the prompt; SmolLM2 reads text, not that marker.
    assert "<bos>" not in smol.tokenizer.decode(run.draft.context(run.prompt_ids))
    first = next(r for r in trace.rounds if r.drafted)
    assert first.translation.mode == "text" and first.translation.ids


def test_gemma_samples_with_smollm2_drafting(gemma, smol, specbench):
    prompt = first_of(specbench, "qa")["prompt"]
    sampling = Sampling(temperature=0.8, seed=1)
    config = RunConfig(
        target="gemma3-270m", draft="smollm2-135m", k=3, prompt=prompt, max_new_tokens=24, sampling=sampling
    )
    trace = api.speculative(api.prepare(config))
    validate(trace)
    assert all(r.translation.mode == "vocab" for r in trace.rounds if r.drafted)
    assert trace.totals.accepted > 0
