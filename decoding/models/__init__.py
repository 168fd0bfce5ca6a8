"""Models: the presets, loading (folders, .gguf files, hub ids), memory checks and the names a
trace may use. `loading.load_model` is the entry point."""

from .loading import LoadedModel, load_model
from .presets import GPU_PAIRS, HUB_PAIRS, OFFLINE_PRESETS, PRESETS

__all__ = ["GPU_PAIRS", "HUB_PAIRS", "OFFLINE_PRESETS", "PRESETS", "LoadedModel", "load_model"]
