"""A head's files: SpecLens writes EAGLE-3's layout (sharded safetensors, `config.json` as vLLM and
SGLang read it) and reads every published layout (layouts.py), from a folder or a hub id; the checks
that refuse a head made for another target; and the heads SpecLens ships."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ...errors import SpecLensError
from ...models.hub import head_snapshot
from ...models.paths import is_local
from .layouts import flat_config, standard_state
from .model import EagleHead, HeadConfig

# assets/heads/ at the repository's root, beside decoding/.
HEADS_DIR = Path(__file__).resolve().parents[3] / "assets" / "heads"
MAX_HEAD_FILE_BYTES = 10_000_000  # a Space repository takes no larger file without LFS
LLAMA_ROPE_THETA, LLAMA_RMS_NORM_EPS = 10000.0, 1e-6  # transformers' LlamaConfig defaults


PARAM_SHAPES = {
    "fc.weight": lambda c: (c.hidden_size, 3 * c.hidden_size),
    "midlayer.input_layernorm.weight": lambda c: (c.hidden_size,),
    "midlayer.hidden_norm.weight": lambda c: (c.hidden_size,),
    "midlayer.post_attention_layernorm.weight": lambda c: (c.hidden_size,),
    "midlayer.self_attn.q_proj.weight": lambda c: (c.num_attention_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.k_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.v_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.o_proj.weight": lambda c: (c.hidden_size, c.num_attention_heads * c.head_dim),
    "midlayer.mlp.gate_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "midlayer.mlp.up_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "midlayer.mlp.down_proj.weight": lambda c: (c.hidden_size, c.intermediate_size),
    "norm.weight": lambda c: (c.hidden_size,),
    "lm_head.weight": lambda c: (c.draft_vocab_size, c.hidden_size),
    "d2t": lambda c: (c.draft_vocab_size,),
    "t2d": lambda c: (c.vocab_size,),
}


def fingerprint(target: nn.Module) -> str:
    """A short hash of some of the target's weights, the same in float32 and bfloat16."""
    h = hashlib.sha256()
    parts = [
        target.get_input_embeddings().weight[:256],
        target.model.layers[-1].mlp.down_proj.weight[:16],
        target.model.norm.weight,
    ]
    for t in parts:
        rounded = t.detach().to("cpu", torch.bfloat16).float().contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(rounded.numpy().tobytes())
    return h.hexdigest()[:16]


def head_config_json(c: HeadConfig, speclens: dict | None = None) -> dict:
    """config.json in EAGLE-3's keys as vLLM and SGLang read them, plus SpecLens's own block.

    The two servers number the tapped layers differently: vLLM reads the top-level
    `eagle_aux_hidden_state_layer_ids` as the layers whose inputs it taps (as SpecLens
    does), SGLang reads only `eagle_config`'s and taps the input of each id + 1 (the
    output of layer id), so that list is one lower. `tie_word_embeddings` stays false
    whatever the target does: SGLang would otherwise draft with the embedding over the
    whole vocabulary instead of `lm_head` over the draft vocabulary.
    """
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "target_hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "eagle_aux_hidden_state_layer_ids": list(c.aux_layers),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in c.aux_layers],
            "use_aux_hidden_state": True,
        },
    }
    if c.norm_before_residual:  # vLLM reads it from the head's config; absent means false
        out["norm_before_residual"] = True
    if c.rope_scaling:
        out["rope_scaling"] = {k: list(v) if isinstance(v, tuple) else v for k, v in c.rope_scaling}
    if speclens:
        out["speclens"] = speclens
    return out


def save_head(head: EagleHead, folder: Path, speclens: dict, dtype: torch.dtype = torch.float16) -> None:
    """Safetensors shards (HF's model-0000N-of-0000M naming), none over 10 MB, and config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("model*.safetensors*"):
        old.unlink()
    state = {
        name: t.detach().cpu().contiguous()
        if t.dtype in (torch.long, torch.bool)
        else t.detach().cpu().to(dtype)
        for name, t in head.state_dict().items()
    }
    shards: list[dict[str, torch.Tensor]] = [{}]
    for name, t in state.items():
        size = t.numel() * t.element_size()
        if shards[-1] and sum(x.numel() * x.element_size() for x in shards[-1].values()) + size > 9_000_000:
            shards.append({})
        shards[-1][name] = t
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (folder / "config.json").write_text(json.dumps(head_config_json(head.c, speclens), indent=2) + "\n")


def _read_state(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if files:
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(folder.glob("*.bin"))
    if bins:
        state = {}
        for f in bins:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
        return state
    raise SpecLensError(f"head folder {folder.name}: no .safetensors or .bin weights")


def read_head_config(folder: Path, target_config) -> tuple[HeadConfig, dict]:
    """The head's config from config.json in any published layout (layouts.py), checked against
    the target's model config. Returns it and the config in EAGLE-3's flat keys."""
    path = folder / "config.json"
    if not path.is_file():
        raise SpecLensError(f"head folder '{folder}' has no config.json (is it a head folder?)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecLensError(f"head config.json is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecLensError("head config.json is not a JSON object: not an EAGLE-3 head")
    raw = flat_config(raw)
    if "draft_vocab_size" not in raw:
        raise SpecLensError("head config.json has no draft_vocab_size: not an EAGLE-3 head")
    _check_fits_target(raw, target_config)
    base = HeadConfig.for_target(target_config, int(raw["draft_vocab_size"]))
    layers = aux_layers(raw) or base.aux_layers
    n_layers = target_config.num_hidden_layers
    if (
        not isinstance(layers, list | tuple)
        or len(layers) != 3
        or not all(isinstance(i, int) and 0 <= i < n_layers for i in layers)
    ):
        raise SpecLensError(f"head reads target layers {layers}, the target has {n_layers}")
    try:
        return _head_config(raw, base, tuple(layers)), raw
    except (TypeError, ValueError, ZeroDivisionError, KeyError) as exc:
        raise SpecLensError(f"head config.json has a malformed value: {exc}") from None


def _check_fits_target(raw: dict, target_config) -> None:
    """Refuse, in one line, a head made for another target's widths or vocabulary."""
    draft_vocab = raw["draft_vocab_size"]
    if not isinstance(draft_vocab, int) or not 0 < draft_vocab <= target_config.vocab_size:
        raise SpecLensError(f"head draft_vocab_size {draft_vocab!r} is not a size within the vocabulary")
    for key in ("hidden_size", "target_hidden_size"):
        if key in raw and raw[key] is not None and raw[key] != target_config.hidden_size:
            raise SpecLensError(
                f"this head is for a target with hidden size {raw[key]}, the target has {target_config.hidden_size}"
            )
    if raw.get("hidden_size") is None:
        raise SpecLensError("head config.json has no hidden_size: not an EAGLE-3 head")
    if raw.get("vocab_size") != target_config.vocab_size:
        raise SpecLensError(
            f"this head is for a vocabulary of {raw.get('vocab_size')} tokens, the target has {target_config.vocab_size}"
        )
    if raw.get("num_hidden_layers", 1) != 1:
        raise SpecLensError(
            f"this head has {raw['num_hidden_layers']} decoder layers; SpecLens's head has one"
        )


def aux_layers(raw: dict) -> object:
    """The target layers whose inputs a head config says its head reads, or None if it names none.

    A top-level list counts as it does in vLLM; else `eagle_config`'s counts as in SGLang,
    which taps the input of each id + 1. A malformed value comes back as it is, to be refused.
    """
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    if top:
        return top
    eagle = raw.get("eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return [i + 1 for i in ids]
    return ids


def _head_config(raw: dict, base: HeadConfig, layers: tuple[int, ...]) -> HeadConfig:
    heads = int(raw.get("num_attention_heads", base.num_attention_heads))
    if heads % int(raw.get("num_key_value_heads", base.num_key_value_heads)):
        raise ValueError("num_key_value_heads must divide num_attention_heads")
    return HeadConfig(
        hidden_size=base.hidden_size,
        intermediate_size=int(raw.get("intermediate_size", base.intermediate_size)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads", base.num_key_value_heads)),
        head_dim=int(raw.get("head_dim") or base.hidden_size // heads),
        # Absent, these are LlamaConfig's defaults, as EAGLE's, vLLM's and SGLang's loaders read them.
        rms_norm_eps=float(raw.get("rms_norm_eps") or LLAMA_RMS_NORM_EPS),
        rope_theta=float(raw.get("rope_theta") or LLAMA_ROPE_THETA),
        vocab_size=base.vocab_size,
        draft_vocab_size=base.draft_vocab_size,
        aux_layers=layers,
        max_position_embeddings=int(raw.get("max_position_embeddings") or base.max_position_embeddings),
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        rope_scaling=_rope_scaling(raw.get("rope_scaling")),
    )


def _rope_scaling(scaling: object) -> tuple[tuple[str, object], ...]:
    """A config's rope_scaling as HeadConfig keeps it; one transformers cannot compute is refused."""
    if not scaling:
        return ()
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling {scaling!r} is not an object")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return ()
    if kind not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_scaling of type {kind!r}, which transformers does not know")
    items = {**scaling, "rope_type": kind}
    items.pop("type", None)
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in items.items()))


def head_folder(name: str, target_config) -> Path:
    """Where the head `head:NAME` names is: a local folder, or a hub id's files (downloaded, or
    from the local cache when offline); a hub repository whose config.json is not a head for this
    target is refused before its weights are fetched."""
    path = Path(name).expanduser()
    if path.exists() or is_local(name) or name.count("/") != 1:
        return path
    return Path(head_snapshot(name, lambda folder: read_head_config(folder, target_config)))


def load_head(folder: str | Path, target: nn.Module, device: torch.device, dtype: torch.dtype) -> EagleHead:
    """A head from its folder, in any published layout, refused with one line if it does not fit `target`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecLensError(f"no head folder at '{folder}'")
    c, raw = read_head_config(folder, target.config)
    want = (raw.get("speclens") or {}).get("fingerprint")
    if want and want != (have := fingerprint(target)):
        raise SpecLensError(
            f"this head was trained for other weights (fingerprint {want}, the target's is {have})"
        )
    try:
        state = _read_state(folder)
    except SpecLensError:
        raise
    except Exception as exc:  # a truncated or foreign file
        raise SpecLensError(
            f"head weights in '{folder.name}' cannot be read: {str(exc).splitlines()[0]}"
        ) from None
    state = standard_state(state, c.draft_vocab_size, c.vocab_size)
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = _target_lm_head(raw, c, target)
    _check_weights(state, c)
    head = EagleHead(c)
    head.load_state_dict(
        {n: t.to(torch.long) if n == "d2t" else t.bool() if n == "t2d" else t for n, t in state.items()}
    )
    return head.to(device=device, dtype=dtype).eval()


def _target_lm_head(raw: dict, c: HeadConfig, target: nn.Module) -> torch.Tensor:
    """A head without an `lm_head` of its own drafts over the whole vocabulary with the target's:
    its embedding where the config ties them, else its output layer (SGLang's rule)."""
    if c.draft_vocab_size != c.vocab_size:
        raise SpecLensError("head weights lack 'lm_head.weight': not the EAGLE-3 layout")
    layer = (
        target.get_input_embeddings() if raw.get("tie_word_embeddings") else target.get_output_embeddings()
    )
    return layer.weight.detach().to("cpu", torch.float32).clone()


def _check_weights(state: dict[str, torch.Tensor], c: HeadConfig) -> None:
    for name, shape_of in PARAM_SHAPES.items():
        if name not in state:
            raise SpecLensError(f"head weights lack '{name}': not the EAGLE-3 layout")
        if tuple(state[name].shape) != shape_of(c):
            raise SpecLensError(
                f"head weight '{name}' has shape {tuple(state[name].shape)}, expected {shape_of(c)}"
            )
    extra = sorted(set(state) - set(PARAM_SHAPES))
    if extra:
        raise SpecLensError(f"head weights have '{extra[0]}', which EAGLE-3's layout does not")
    draft_ids = torch.arange(c.draft_vocab_size) + state["d2t"].long()
    if draft_ids.min() < 0 or draft_ids.max() >= c.vocab_size:
        raise SpecLensError("head d2t maps draft tokens outside the target's vocabulary")


def shipped_head(target_name: str) -> Path:
    """assets/heads/<target preset>: the head SpecLens trained for it."""
    folder = HEADS_DIR / target_name
    if not (folder / "config.json").is_file():
        raise SpecLensError(
            f"no trained head ships for '{target_name}' (see assets/heads/; or use head:PATH)"
        )
    return folder
