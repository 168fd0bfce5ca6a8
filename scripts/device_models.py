"""Random-weight models of real configurations, for timing on a machine that cannot fetch weights.

`python scripts/device_models.py FOLDER TOKENIZER_FOLDER` writes SmolLM2-135M's and SmolLM2-1.7B's
architectures with random weights (bfloat16) and SmolLM2's tokenizer into FOLDER/<name>. Their
outputs mean nothing; their steps cost what the real models' do.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHARED = dict(
    vocab_size=49152,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    hidden_act="silu",
)
CONFIGS = {
    "smollm2-135m-random": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
    ),
    "smollm2-1.7b-random": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        rope_theta=130000.0,
    ),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build(folder: Path, tokenizer: Path) -> list[Path]:
    made = []
    for name, shape in CONFIGS.items():
        out = folder / name
        if not (out / "config.json").exists():
            torch.manual_seed(0)
            with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
                model = LlamaForCausalLM(LlamaConfig(**(SHARED | shape))).to(torch.bfloat16)
            model.save_pretrained(out)
            for f in TOKENIZER_FILES:
                if (tokenizer / f).exists():
                    shutil.copy(tokenizer / f, out / f)
        made.append(out)
    return made


if __name__ == "__main__":
    for path in build(Path(sys.argv[1]), Path(sys.argv[2])):
        print(path)
