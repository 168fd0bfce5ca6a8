"""Heads in every published layout load and draft as the same weights do in SpecLens's layout, by
folder or by hub id (offline, from the Hugging Face cache). The layouts are written from
tests/data/eagle3-layouts.json, which names the publishers' files and commits each name comes from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants as hub_constants
import pytest
import torch
from conftest import ROOT, tiny_llama, tiny_model_folder
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from decoding.core.speculative import speculative_generate
from decoding.drafts import build_draft
from decoding.drafts.head import EagleHead, HeadCache, HeadConfig, HeadDraft, load_head, save_head
from decoding.drafts.head.files import _rope_scaling
from decoding.drafts.head.layouts import flat_config, layout_of
from decoding.drafts.head.model import rotation
from decoding.errors import HubUnreachableError, SpecLensError
from decoding.models.loading import LoadedModel
from decoding.settings.policies import make_policy

LAYOUTS = json.loads((ROOT / "tests" / "data" / "eagle3-layouts.json").read_text())
CPU = torch.device("cpu")
HUB_ID = "tiny-org/tiny-eagle3"


def random_head(target, draft_ids: list[int], aux_layers=None, seed: int = 0, **config) -> EagleHead:
    """An untrained head over `draft_ids` with weights wide enough for its drafts to differ by input."""
    c = HeadConfig.for_target(target.config, len(draft_ids))
    changes = {"aux_layers": aux_layers or c.aux_layers, **config}
    c = HeadConfig(**{**c.__dict__, **changes})
    torch.manual_seed(seed)
    head = EagleHead(c)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3 if p.dim() > 1 else 1.0)
    ids = torch.tensor(draft_ids)
    head.d2t.copy_(ids - torch.arange(len(ids)))
    head.t2d[ids] = True
    return head.eval()


def _values(c: HeadConfig, keys: list[str]) -> dict:
    return {k: getattr(c, k) for k in keys}


def write_eagle(head: EagleHead, folder: Path, target) -> Path:
    """EAGLE's own: pytorch_model.bin, no tapped-layer ids, the maps dropped at a full vocabulary."""
    spec = LAYOUTS["layouts"]["eagle"]
    folder.mkdir(parents=True)
    config = {k: v for k, v in spec["config"].items() if k != "keys"} | _values(
        head.c, spec["config"]["keys"]
    )
    (folder / "config.json").write_text(json.dumps(config))
    state = dict(head.state_dict())
    if spec["maps_dropped_at_full_vocabulary"] and head.c.draft_vocab_size == head.c.vocab_size:
        del state["d2t"], state["t2d"]
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    torch.save(state, folder / spec["weights_file"])
    return folder


def write_specforge(head: EagleHead, folder: Path, target) -> Path:
    """SpecForge's: the ids under eagle_config as the outputs of the layer before, tied embeddings
    declared beside the head's own lm_head."""
    spec = LAYOUTS["layouts"]["specforge"]
    folder.mkdir(parents=True)
    config = {k: v for k, v in spec["config"].items() if k != "keys"} | _values(
        head.c, spec["config"]["keys"]
    )
    section, key = spec["tapped_layers"]["key"].split(".")
    assert spec["tapped_layers"]["written_as"] == "input - 1"
    config[section] = {key: [i - 1 for i in head.c.aux_layers], "use_aux_hidden_state": True}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: t.contiguous() for k, t in head.state_dict().items()}, str(folder / spec["weights_file"]))
    return folder


def write_speculators(head: EagleHead, folder: Path, target) -> Path:
    """The `speculators` format: the layer's config nested, the head's keys beside it, layers.0."""
    spec = LAYOUTS["layouts"]["speculators"]
    folder.mkdir(parents=True)
    layer_spec = spec["config"]["layer_config"]
    layer = {k: v for k, v in layer_spec.items() if k != "keys"} | _values(head.c, layer_spec["keys"])
    head_keys = {
        "draft_vocab_size": head.c.draft_vocab_size,
        "norm_before_residual": head.c.norm_before_residual,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(head.c.aux_layers),
    }
    assert set(head_keys) == set(spec["config"]["head_keys"])
    config = {
        "architectures": spec["config"]["architectures"],
        "speculators_model_type": spec["config"]["speculators_model_type"],
        spec["config"]["layer_config_key"]: layer,
        **head_keys,
        **spec["config"]["off"],
        "speculators_config": spec["config"]["speculators_config"],
    }
    (folder / "config.json").write_text(json.dumps(config))
    ((old, new),) = spec["rename"].items()
    state = {k.replace(old, new, 1) if k.startswith(old) else k: t for k, t in head.state_dict().items()}
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    save_file({k: t.contiguous() for k, t in state.items()}, str(folder / spec["weights_file"]))
    return folder


def write_speclens(head: EagleHead, folder: Path, target) -> Path:
    save_head(head, folder, {}, dtype=torch.float64)
    return folder


WRITERS = {"eagle": write_eagle, "specforge": write_specforge, "speculators": write_speculators}


def drafts(target, head: EagleHead) -> list[list[int]]:
    """Every round's drafted tokens over a greedy run: what the head proposed, round by round."""
    trace = speculative_generate(
        target,
        torch.tensor([[5, 6, 7, 8, 9]]),
        HeadDraft(head, target, "h"),
        make_policy("fixed", 3),
        max_new_tokens=24,
    )
    assert trace.totals.proposed > 0
    return [[d.id for d in r.draft] for r in trace.rounds]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=8)


CASES = {
    # EAGLE's own names no layers: the head must read EAGLE-3's default ones.
    "eagle": {"layout": "eagle", "draft_ids": list(range(0, 48, 3)), "aux": None},
    "eagle, full vocabulary": {"layout": "eagle", "draft_ids": list(range(64)), "aux": None},
    "specforge": {"layout": "specforge", "draft_ids": list(range(0, 48, 3)), "aux": (1, 3, 6)},
    "speculators": {"layout": "speculators", "draft_ids": list(range(0, 48, 3)), "aux": (1, 3, 6)},
    "speculators, norm before residual": {
        "layout": "speculators",
        "draft_ids": list(range(0, 48, 3)),
        "aux": (1, 3, 6),
        "config": {"norm_before_residual": True},
    },
}


@pytest.mark.parametrize("case", CASES)
def test_each_published_layout_drafts_as_the_same_weights_in_speclens_layout(target, tmp_path, case):
    spec = CASES[case]
    head = random_head(target, spec["draft_ids"], spec["aux"], **spec.get("config", {})).to(torch.float64)
    folder = WRITERS[spec["layout"]](head, tmp_path / spec["layout"], target)
    assert layout_of(json.loads((folder / "config.json").read_text())) == spec["layout"]
    published = load_head(folder, target, CPU, torch.float64)
    own = load_head(write_speclens(head, tmp_path / "speclens", target), target, CPU, torch.float64)
    assert published.c == own.c == head.c
    for name, t in own.state_dict().items():
        assert torch.equal(published.state_dict()[name], t), name
    assert drafts(target, published) == drafts(target, own)


def test_sglang_reads_specforge_ids_as_the_layer_before(target, tmp_path):
    """Read without SGLang's + 1, the head would tap other layers and draft otherwise."""
    head = random_head(target, list(range(0, 48, 3)), (1, 3, 6)).to(torch.float64)
    folder = write_specforge(head, tmp_path / "specforge", target)
    assert load_head(folder, target, CPU, torch.float64).c.aux_layers == (1, 3, 6)
    shifted = random_head(target, list(range(0, 48, 3)), (0, 2, 5)).to(torch.float64)
    shifted.load_state_dict(head.state_dict())
    assert drafts(target, shifted) != drafts(target, head)


def test_norm_before_residual_adds_the_normed_feature(target):
    """vLLM's and speculators' norm_before_residual: the residual is hidden_norm(feature). With the
    norm's weight 1 the norm is idempotent (up to its eps), so it equals the plain layer fed the
    normed feature."""
    head = random_head(target, list(range(16)), norm_before_residual=True).to(torch.float64)
    head.midlayer.hidden_norm.weight.data.fill_(1.0)
    plain = random_head(target, list(range(16))).to(torch.float64)
    plain.load_state_dict(head.state_dict())
    emb, feature = torch.randn(3, 32, dtype=torch.float64), 5 * torch.randn(3, 32, dtype=torch.float64)
    ours = head.step(emb, feature, HeadCache())
    assert torch.allclose(ours, plain.step(emb, head.midlayer.hidden_norm(feature), HeadCache()), atol=1e-4)
    assert not torch.allclose(ours, plain.step(emb, feature, HeadCache()))


def test_tied_embeddings_beside_its_own_lm_head_draft_with_the_heads(target, tmp_path):
    """AngelSlim/Qwen3-1.7B_eagle3's config: tie_word_embeddings true and an lm_head of its own."""
    head = random_head(target, list(range(64))).to(torch.float64)
    folder = write_specforge(head, tmp_path / "tied", target)
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is True
    loaded = load_head(folder, target, CPU, torch.float64)
    assert torch.equal(loaded.lm_head.weight, head.lm_head.weight)
    assert not torch.equal(loaded.lm_head.weight, target.get_input_embeddings().weight)


def test_without_an_lm_head_a_full_vocabulary_head_drafts_with_the_targets(target, tmp_path):
    head = random_head(target, list(range(64))).to(torch.float64)
    folder = write_eagle(head, tmp_path / "eagle", target)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    del state["lm_head.weight"]
    torch.save(state, folder / "pytorch_model.bin")
    loaded = load_head(folder, target, CPU, torch.float64)
    assert torch.equal(loaded.lm_head.weight, target.get_output_embeddings().weight)


def _rewrite_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def _set(path: str, value):
    def change(config):
        *parents, key = path.split(".")
        for p in parents:
            config = config[p]
        config[key] = value

    return change


REFUSED = {
    ("eagle", "other hidden size"): (_set("hidden_size", 4096), "hidden size 4096"),
    ("eagle", "other vocabulary"): (_set("vocab_size", 128256), "vocabulary of 128256"),
    ("eagle", "two layers"): (_set("num_hidden_layers", 2), "2 decoder layers"),
    ("specforge", "other target width"): (_set("target_hidden_size", 2048), "hidden size 2048"),
    ("specforge", "tapped layer out of range"): (
        _set("eagle_config.eagle_aux_hidden_state_layer_ids", [1, 2, 40]),
        "target layers [2, 3, 41]",
    ),
    ("speculators", "other hidden size"): (
        _set("transformer_layer_config.hidden_size", 4096),
        "hidden size 4096",
    ),
    ("speculators", "other vocabulary"): (_set("transformer_layer_config.vocab_size", 151936), "151936"),
    ("speculators", "qwen3 layer"): (
        _set("transformer_layer_config.model_type", "qwen3"),
        "Llama's layer only",
    ),
    ("speculators", "norm before fc"): (_set("norm_before_fc", True), "sets norm_before_fc"),
    ("speculators", "another algorithm"): (_set("speculators_model_type", "mtp"), "not an EAGLE-3 head"),
    ("speculators", "unknown rope"): (
        _set("transformer_layer_config.rope_scaling", {"rope_type": "spiral"}),
        "malformed value",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=" / ".join)
def test_a_head_that_does_not_fit_the_target_is_refused_in_one_line(target, tmp_path, case):
    layout, _ = case
    head = random_head(target, list(range(0, 48, 3)), (1, 3, 6)).to(torch.float64)
    folder = WRITERS[layout](head, tmp_path / layout, target)
    change, words = REFUSED[case]
    _rewrite_config(folder, change)
    with pytest.raises(SpecLensError) as err:
        load_head(folder, target, CPU, torch.float64)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_d2t_outside_the_vocabulary_is_refused(target, tmp_path):
    head = random_head(target, list(range(0, 48, 3))).to(torch.float64)
    head.d2t[-1] = 500
    folder = write_speculators(head, tmp_path / "speculators", target)
    with pytest.raises(SpecLensError, match="d2t maps draft tokens outside"):
        load_head(folder, target, CPU, torch.float64)


def test_a_speculators_config_reads_as_eagle3s_flat_keys():
    flat = flat_config(
        {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": {"model_type": "llama", "hidden_size": 8, "vocab_size": 9},
            "draft_vocab_size": 4,
            "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        }
    )
    assert flat == {
        "model_type": "llama",
        "hidden_size": 8,
        "vocab_size": 9,
        "draft_vocab_size": 4,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "norm_before_residual": False,
    }


def test_a_llama3_scaled_rotary_embedding_is_transformers_own(target):
    """Llama 3.1's heads carry its rope_scaling; the head rotates as transformers' Llama does."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # fmt: skip
    head = random_head(target, list(range(16)), rope_scaling=_rope_scaling(scaling), rope_theta=500000.0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=8, rope_theta=500000.0,
                         max_position_embeddings=512, rope_scaling=scaling)  # fmt: skip
    positions = torch.arange(300)
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions[None])
    ours = rotation(positions, head.c)
    assert torch.allclose(ours[0], cos[0], atol=1e-6) and torch.allclose(ours[1], sin[0], atol=1e-6)
    plain = random_head(target, list(range(16)), rope_theta=500000.0)
    assert not torch.allclose(rotation(positions, plain.c)[0], cos[0], atol=1e-3)


# -- by hub id ------------------------------------------------------------------------------------


def hub_cache(root: Path, repo_id: str, files: Path) -> Path:
    """The Hugging Face cache's own layout for one model repository: refs/main names a snapshot."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    (repo / "snapshots").mkdir()
    files.rename(repo / "snapshots" / revision)
    return root


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline: this process reads it as HF_HUB_CACHE names it."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_head_by_hub_id_loads_from_the_cache_offline(target, tmp_path, offline_cache):
    head = random_head(target, list(range(0, 48, 3)), (1, 3, 6)).to(torch.float64)
    hub_cache(offline_cache, HUB_ID, write_speculators(head, tmp_path / "files", target))
    loaded = LoadedModel("tiny", "tiny", target, None, CPU, torch.float64)
    draft = build_draft(f"head:{HUB_ID}", loaded)
    assert draft.name == f"head:{HUB_ID}"
    assert drafts(target, draft.head) == drafts(target, head)


def test_a_head_neither_cached_nor_reachable_is_one_line(target, offline_cache):
    loaded = LoadedModel("tiny", "tiny", target, None, CPU, torch.float64)
    with pytest.raises(HubUnreachableError) as err:
        build_draft(f"head:{HUB_ID}", loaded)
    assert str(err.value) == (
        f"cannot fetch the head '{HUB_ID}': the Hugging Face Hub is not reachable from here "
        "(no network?) and the head is not in the local cache"
    )


def test_a_repository_that_is_no_head_for_the_target_is_refused_before_its_weights(
    target, tmp_path, offline_cache
):
    """Only config.json comes first: a model's own repository (or a head for another target) is
    refused by it, and the weights, which may be a large model's, are never fetched."""
    loaded = LoadedModel("tiny", "tiny", target, None, CPU, torch.float64)
    files = tmp_path / "model"
    files.mkdir()
    target.config.to_json_file(files / "config.json")
    hub_cache(offline_cache, HUB_ID, files)
    with pytest.raises(SpecLensError, match="no draft_vocab_size: not an EAGLE-3 head"):
        build_draft(f"head:{HUB_ID}", loaded)
    head_only = tmp_path / "head"
    write_eagle(random_head(target, list(range(16))), head_only, target)
    (head_only / "pytorch_model.bin").unlink()  # its config cached, its weights not
    hub_cache(offline_cache, "tiny-org/config-only", head_only)
    with pytest.raises(HubUnreachableError, match="not in the local cache"):
        build_draft("head:tiny-org/config-only", loaded)


def test_the_command_line_takes_a_head_by_hub_id_offline(tmp_path):
    """`--draft head:ORG/NAME` with HF_HOME's cache and no network: the cached head drafts; an
    uncached one is one line on stderr and exit status 2."""
    folder = tiny_model_folder(tmp_path / "tiny")
    target = AutoModelForCausalLM.from_pretrained(folder)
    head = random_head(target, list(range(0, 24, 2)))
    hf_home = tmp_path / "hf-home"
    hub_cache(hf_home / "hub", HUB_ID, write_eagle(head, tmp_path / "files", target))
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    base = [sys.executable, "-m", "decoding", "generate", "--target", str(folder), "--prompt", "a b c"]
    ran = subprocess.run(
        [*base, "--draft", f"head:{HUB_ID}", "--max-new-tokens", "8", "--trace-out", str(tmp_path / "t.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads((tmp_path / "t.json").read_text())["meta"]["draft"] == f"head:{HUB_ID}"
    missing = subprocess.run(
        [*base, "--draft", "head:tiny-org/not-cached"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=env,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        "error: cannot fetch the head 'tiny-org/not-cached': the Hugging Face Hub is not reachable from here "
        "(no network?) and the head is not in the local cache"
    ]
