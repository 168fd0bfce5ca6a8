"""Text in and out of a model: the prompt as the model reads it, the tokens that end a text, and
each token's own text."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch


def chat_text(tokenizer, prompt: str, chat: bool = True) -> str:
    """The prompt as the model reads it: a user turn in the tokenizer's chat template when it has
    one (and `chat` is on), else the prompt itself."""
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
    return prompt


def prompt_token_ids(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """The token ids of `chat_text`; a template brings its own special tokens."""
    text = chat_text(tokenizer, prompt, chat)
    return tokenizer(text, add_special_tokens=text is prompt)["input_ids"]


def eos_ids(model: torch.nn.Module, tokenizer) -> set[int]:
    """Every token id that ends a text: the generation config's and the tokenizer's."""
    ids = set()
    for source in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update(source if isinstance(source, list) else [source])
    return ids


def token_texts(tokenizer) -> Callable[[int], str]:
    """id -> text of that token alone, memoised (the loop asks for each id often)."""

    @cache
    def text(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False)

    return text
