"""A head folder is what vLLM's and SGLang's EAGLE-3 loaders read, checked against a table
written from their code (tests/data/eagle3-serving.json names the files and commits)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from conftest import ROOT, tiny_llama
from safetensors import safe_open

from decoding.drafts.head import EagleHead, HeadConfig, load_head, save_head
from decoding.drafts.head.files import MAX_HEAD_FILE_BYTES

SERVING = json.loads((ROOT / "tests" / "data" / "eagle3-serving.json").read_text())
SHIPPED = ROOT / "assets" / "heads" / "smollm2-135m"
# HuggingFaceTB/SmolLM2-135M-Instruct's config.json: the shipped head's target.
SMOLLM2 = {"num_hidden_layers": 30, "max_position_embeddings": 8192}


def _dim(expr: str, config: dict) -> int:
    """A shape's dimension from the table ("3*target_hidden_size") and a config."""
    # Both loaders read hidden_size where target_hidden_size is absent.
    values = {"target_hidden_size": config["hidden_size"]} | config
    return math.prod(int(t) if t.isdigit() else int(values[t]) for t in expr.split("*"))


def _tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """name -> (dtype, shape, shard file) from the safetensors headers, without loading the weights."""
    found = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in sorted(f.keys()):
                part = f.get_slice(name)
                found[name] = (part.get_dtype(), tuple(part.get_shape()), path.name)
    return found


def _lookup(config: dict, dotted: str):
    for key in dotted.split("."):
        config = config.get(key) if isinstance(config, dict) else None
    return config


def tapped_layers(config: dict, server: str) -> list[int] | None:
    """The target layers whose inputs `server` feeds the head, by the table's rule (None: its default)."""
    rule = SERVING["aux_layers"][server]
    ids = next((v for v in (_lookup(config, k) for k in rule["reads"]) if v), None)
    if ids is None:
        return None
    shift = 1 if rule["taps_input_of_layer"] == "id + 1" else 0
    return [i + shift for i in ids]


def config_problems(config: dict, target: dict) -> list[str]:
    problems = []
    for key, want in SERVING["config"].items():
        have = config.get(key)
        if have is None:
            if not want.get("optional"):
                problems.append(f"{key} missing")
        elif "equals" in want and have != want["equals"]:
            problems.append(f"{key} is {have!r}, the loaders need {want['equals']!r}")
        elif want.get("type") == "int" and not (isinstance(have, int) and not isinstance(have, bool)):
            problems.append(f"{key} is {have!r}, not an int")
        elif want.get("type") == "float" and not isinstance(have, int | float):
            problems.append(f"{key} is {have!r}, not a number")
        elif "at_least" in want and have < target[want["at_least"].split(".")[1]]:
            problems.append(f"{key} is {have}, below the target's {target[want['at_least'].split('.')[1]]}")
    return problems


def weight_problems(folder: Path, config: dict) -> list[str]:
    tensors, problems = _tensors(folder), []
    wanted = SERVING["weights"] | {k: v for k, v in SERVING["optional_weights"].items() if k in tensors}
    if set(tensors) != set(wanted):
        problems.append(f"weights {sorted(set(tensors) ^ set(wanted))} differ from the loaders' names")
    for name, want in wanted.items():
        if name not in tensors:
            continue
        dtype, shape, _ = tensors[name]
        expected = tuple(_dim(d, config) for d in want["shape"])
        if shape != expected:
            problems.append(f"{name} has shape {shape}, the loaders build {expected}")
        if dtype not in (SERVING["float_dtypes"] if want["dtype"] == "float" else [want["dtype"]]):
            problems.append(f"{name} is {dtype}, the loaders expect {want['dtype']}")
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    if index != {name: shard for name, (_, _, shard) in tensors.items()}:
        problems.append("model.safetensors.index.json does not name every tensor's shard")
    big = [f.name for f in folder.iterdir() if f.stat().st_size >= MAX_HEAD_FILE_BYTES]
    return problems + [f"{name} is over 10 MB" for name in big]


def mapped_ids(folder: Path, config: dict) -> torch.Tensor:
    """The target ids the draft vocabulary maps to, as both loaders compute them from d2t."""
    shard = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]["d2t"]
    with safe_open(str(folder / shard), "pt") as f:
        d2t = f.get_tensor("d2t")
    return torch.arange(config["draft_vocab_size"]) + d2t


def test_the_shipped_head_loads_in_vllm_and_sglang_as_it_is():
    config = json.loads((SHIPPED / "config.json").read_text())
    # It was trained on the inputs of layers 2, 15 and 27 (docs/trained-head.md); both servers must tap those.
    assert tapped_layers(config, "vllm") == tapped_layers(config, "sglang") == [2, 15, 27]
    assert config_problems(config, SMOLLM2) == []
    assert weight_problems(SHIPPED, config) == []
    ids = mapped_ids(SHIPPED, config)
    assert ids.unique().numel() == ids.numel() and ids.min() >= 0 and ids.max() < config["vocab_size"]


def test_a_saved_head_is_what_vllm_and_sglang_load(tmp_path):
    target = tiny_llama(seed=3, layers=8)
    head = EagleHead(HeadConfig.for_target(target.config, 16))
    torch.manual_seed(0)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    head.d2t.copy_(torch.arange(0, 48, 3) - torch.arange(16))
    head.t2d[torch.arange(0, 48, 3)] = True
    save_head(head, tmp_path / "head", {"target": "tiny"})

    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config_problems(config, target.config.to_dict()) == []
    assert weight_problems(tmp_path / "head", config) == []
    assert (
        tapped_layers(config, "vllm")
        == tapped_layers(config, "sglang")
        == list(head.c.aux_layers)
        == [2, 4, 5]
    )
    assert mapped_ids(tmp_path / "head", config).tolist() == list(range(0, 48, 3))
    # SpecLens reads the folder back as the same head, its weights as saved (float16).
    loaded = load_head(tmp_path / "head", target, torch.device("cpu"), torch.float32)
    assert loaded.c == head.c
    for name, t in head.state_dict().items():
        want = t if t.dtype in (torch.long, torch.bool) else t.half().float()
        assert torch.equal(loaded.state_dict()[name], want), name


def test_either_servers_list_alone_names_the_same_layers(tmp_path):
    """A head from elsewhere may carry only one of the two lists; SpecLens reads each as its server does."""
    target = tiny_llama(seed=3, layers=8)
    head = EagleHead(HeadConfig.for_target(target.config, 16))
    save_head(head, tmp_path / "head", {})
    path = tmp_path / "head" / "config.json"
    full = json.loads(path.read_text())
    only_sglang = {k: v for k, v in full.items() if k != "eagle_aux_hidden_state_layer_ids"}
    only_vllm = {k: v for k, v in full.items() if k != "eagle_config"}
    for config, server in ((only_sglang, "sglang"), (only_vllm, "vllm")):
        path.write_text(json.dumps(config))
        assert tapped_layers(config, server) == [2, 4, 5]
        assert load_head(tmp_path / "head", target, torch.device("cpu"), torch.float32).c.aux_layers == (
            2,
            4,
            5,
        )
