"""GGUF files (how the offline presets ship) turned into plain transformers folders in the cache."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from ..settings.environment import cache_dir


def convert_gguf(gguf: Path, cache_name: str) -> Path:
    """Dequantise a GGUF file into a transformers folder in the cache, once.

    transformers refuses to save a model loaded from GGUF; dropping the
    quantizer record makes it a plain float model that saves and reloads in
    under a second.
    """
    out = cache_dir() / "models" / cache_name
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache_name}-", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # Rename last, so an interrupted conversion never looks finished.
        try:
            tmp.rename(out)
        except OSError:  # another process converted it first: theirs stands
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
