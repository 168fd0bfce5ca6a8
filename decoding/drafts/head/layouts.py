"""The layouts EAGLE-3 heads are published in, read as one.

- SpecLens's own: EAGLE-3's weight names, the config keys vLLM and SGLang read, a `speclens` block.
- EAGLE's (`yuhuili/EAGLE3-*`): `pytorch_model.bin`, `LlamaForCausalLMEagle3`, no tapped-layer ids
  (EAGLE-3's default low, middle and high layers), no `d2t`/`t2d` where the draft vocabulary is
  the target's.
- SpecForge's (`lmsys/sglang-EAGLE3-*`): the ids under `eagle_config`, which SGLang reads as layer
  outputs (the input of id + 1); often `tie_word_embeddings: true` beside the head's own `lm_head`.
- The `speculators` format (`RedHatAI/*speculator.eagle3`): `Eagle3Speculator`, the layer's config
  under `transformer_layer_config`, the head's own keys beside it, weights under `layers.0.` where
  the others say `midlayer.`.

`flat_config` turns any of them into EAGLE-3's flat keys and `standard_state` their weights into
EAGLE-3's names; `files.py` reads the result into one `HeadConfig`. Where each name comes from
(the publishers' loaders and converters, file and commit): tests/data/eagle3-layouts.json.
"""

from __future__ import annotations

import torch

from ...errors import SpecLensError

LAYOUTS = ("speclens", "eagle", "specforge", "speculators")
# Keys of a `speculators` config that sit beside `transformer_layer_config` and mean what they
# mean in EAGLE-3's flat config (vLLM's speculators/algos.py copies these four).
SPECULATORS_HEAD_KEYS = (
    "draft_vocab_size",
    "target_hidden_size",
    "norm_before_residual",
    "eagle_aux_hidden_state_layer_ids",
)
# `speculators` options that change the head's computation in ways SpecLens's head does not run.
SPECULATORS_UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")
# The verifier's weights a speculators checkpoint may carry; the target's own are used instead.
DROPPED_WEIGHTS = ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight")


def layout_of(raw: dict) -> str:
    """Which published layout a head's config.json is in (see the module's docstring)."""
    architectures = raw.get("architectures") or []
    if "speculators_model_type" in raw or "Eagle3Speculator" in architectures:
        return "speculators"
    if isinstance(raw.get("speclens"), dict):
        return "speclens"
    eagle = raw.get("eagle_config")
    if isinstance(eagle, dict) and "eagle_aux_hidden_state_layer_ids" in eagle:
        return "specforge"
    return "eagle"


def flat_config(raw: dict) -> dict:
    """The head's config in EAGLE-3's flat keys, whatever its layout; one line where it cannot be."""
    if layout_of(raw) != "speculators":
        return raw
    if raw.get("speculators_model_type", "eagle3") != "eagle3":
        raise SpecLensError(
            f"this is a speculators model of type '{raw.get('speculators_model_type')}', not an EAGLE-3 head"
        )
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise SpecLensError("this speculators head has no transformer_layer_config")
    if layer.get("model_type", "llama") != "llama":
        raise SpecLensError(
            f"this speculators head's layer is {layer.get('model_type')}'s; SpecLens runs Llama's layer only"
        )
    unsupported = [key for key in SPECULATORS_UNSUPPORTED if raw.get(key)]
    if unsupported:
        raise SpecLensError(
            f"this speculators head sets {unsupported[0]}, which SpecLens's head does not run"
        )
    flat = {k: v for k, v in layer.items() if k not in SPECULATORS_HEAD_KEYS}
    flat.update({k: raw[k] for k in SPECULATORS_HEAD_KEYS if raw.get(k) is not None})
    # The format's own default where the file leaves it out (Eagle3SpeculatorConfig's field).
    flat.setdefault("norm_before_residual", False)
    return flat


def standard_state(state: dict[str, torch.Tensor], draft_vocab: int, vocab: int) -> dict[str, torch.Tensor]:
    """The weights under EAGLE-3's names, with `d2t` and `t2d` where the file leaves them out."""
    state = {
        "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name: t
        for name, t in state.items()
        if name not in DROPPED_WEIGHTS
    }
    more = sorted(n for n in state if n.startswith("layers."))
    if more:
        raise SpecLensError(
            f"this head has more than one decoder layer ('{more[0]}'); SpecLens's head has one"
        )
    if "d2t" not in state and draft_vocab == vocab:
        # EAGLE drops both maps where the draft vocabulary is the target's; vLLM reads d2t as zeros.
        state["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
    if "t2d" not in state and "d2t" in state:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        ids = torch.arange(draft_vocab) + state["d2t"].long()
        if ids.numel() and int(ids.min()) >= 0 and int(ids.max()) < vocab:
            t2d[ids] = True
        state["t2d"] = t2d
    return state
