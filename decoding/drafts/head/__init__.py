"""A draft head SpecLens trains, in the EAGLE-3 layout.

A head is one decoder layer that reads three of the target's own hidden
states (a low, a middle and a high layer, tapped while the target verifies)
together with the embedding of the next token, and predicts the token after
it from a reduced draft vocabulary. `model` is the module, `tap` reads the
target's features, `files` saves it as vLLM and SGLang load it and loads it from a
folder or a hub id in every published layout (`layouts`),
`draft` makes it a draft source and `kernel` runs its step through the
layer kernel in the default CPU mode.
"""

from .draft import HeadDraft
from .files import HEADS_DIR, fingerprint, head_folder, load_head, save_head, shipped_head
from .kernel import HeadKernel
from .model import EagleHead, HeadCache, HeadConfig
from .tap import FeatureTap

__all__ = [
    "HEADS_DIR",
    "EagleHead",
    "FeatureTap",
    "HeadCache",
    "HeadConfig",
    "HeadDraft",
    "HeadKernel",
    "fingerprint",
    "head_folder",
    "load_head",
    "save_head",
    "shipped_head",
]
