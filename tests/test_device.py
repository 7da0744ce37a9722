"""Devices, precision and compilation (training/device.py, the engine), checked without a GPU.

CI has no GPU, so device bugs are caught on the CPU in two ways:

* every model that ``interlayer models`` lists (each depth cut to 2: ``shallow``) runs forward and backward on the
  ``meta`` device, where a tensor created on the CPU (a missing ``device=``) fails to mix with the model's and any
  host synchronisation (``.item()``, ``bool(tensor)``) fails outright;
* decoding and each task's training step run on the CPU while ``torch.set_default_device("meta")`` is in force, so
  a factory call without ``device=`` creates a meta tensor that cannot meet the CPU ones.

``torch._dynamo.explain`` asserts zero graph breaks for every model. Tests marked ``gpu`` run only where CUDA is.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._inductor.config

from helpers import gpu
from interlayer import create_model, get_config, list_models
from interlayer.core.config import ConfigError
from interlayer.devices import resolve_device
from interlayer.models.gat import with_self_loops
from interlayer.training.device import autocast, move, resolve_precision

NAMES = list_models()
TRANSFORMERS = set(list_models(family="transformer"))
MCANS = set(list_models(family="mcan"))


def example_inputs(model: torch.nn.Module, device: str) -> tuple[tuple, dict]:
    """A small input of the right kind for any model family, built on ``device``."""
    cfg = model.config
    kind = type(model).__name__
    if kind in ("ImageClassifier", "SwinClassifier", "AAResNet"):
        return (torch.ones(2, cfg.channels, cfg.image_height, cfg.image_width, device=device),), {}
    if kind in ("Captioner", "Grounder"):  # region features and boxes, the second image with 3 padded regions
        features = torch.ones(2, 10, cfg.feature_dim, device=device)
        boxes = torch.full((2, 10, 5), 0.25, device=device)
        padding = torch.zeros(2, 10, dtype=torch.bool, device=device)
        padding[1, 7:] = True
        words = torch.full((2, 6), 5, dtype=torch.long, device=device)
        regions = (features, boxes, padding)
        return ((*regions, words) if kind == "Captioner" else (words, *regions)), {}
    if kind == "MCAN":  # padding in the second question and, for region features, in the second image
        question = torch.full((2, 4), 5, dtype=torch.long, device=device)  # short: the LSTM loop is unrolled
        padding = torch.zeros(2, 4, dtype=torch.bool, device=device)
        padding[1, 3:] = True
        if cfg.image_input == "pixels":
            return (question, padding, torch.ones(2, cfg.image_channels, cfg.image_size, cfg.image_size,
                                                  device=device)), {}
        regions = torch.zeros(2, 10, dtype=torch.bool, device=device)
        regions[1, 7:] = True
        return (question, padding, torch.ones(2, 10, cfg.feature_dim, device=device), regions), {}
    if kind == "GAT":  # the graph task adds the self-loops once, outside the forward pass (GAT.forward)
        edges = with_self_loops(torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]]), 6).to(device)
        return (torch.ones(6, cfg.in_features, device=device), edges), {"self_loops": True}
    tokens = torch.full((2, 12), 5, dtype=torch.long, device=device)
    tokens[1, 9:] = getattr(cfg, "pad_id", 0)  # padding in the second sequence
    if kind == "CNNTextClassifier":
        return (tokens,), {}
    if cfg.arch == "encoder_decoder":
        return (tokens, tokens[:, :9]), {}
    if cfg.positions == "relative_2d":
        return (), {"inputs_embeds": torch.ones(2, cfg.grid_height * cfg.grid_width, cfg.d_model, device=device)}
    return (tokens,), ({"segments": torch.zeros_like(tokens)} if cfg.n_segments else {})


def scalar_loss(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        heads = [output]
    elif hasattr(output, "logits"):
        heads = [output.logits]
    else:  # the REC grounder: a score per region, and a box offset per region where it regresses them
        heads = [output.scores] + ([output.offsets] if output.offsets is not None else [])
    loss = sum(head.float().sum() for head in heads)
    for value in getattr(output, "aux_losses", {}).values():
        loss = loss + value
    return loss


# A config's depths: a count of layers or blocks, or one count a stage (AA-ResNet's layers, Swin's depths)
DEPTHS = ("enc_layers", "dec_layers", "layers", "depths", "stage_blocks")


def shallower(config: dict, prefix: str = "") -> dict[str, object]:
    """The overrides that cut every depth of ``config`` (its nested sections' too) to at most 2."""
    overrides: dict[str, object] = {}
    for key, value in config.items():
        if key in DEPTHS and isinstance(value, int) and value > 2:
            overrides[prefix + key] = 2
        elif key in DEPTHS and isinstance(value, list) and any(v > 2 for v in value):
            overrides[prefix + key] = [min(v, 2) for v in value]
        elif isinstance(value, dict):
            overrides.update(shallower(value, f"{prefix}{key}."))
    return overrides


def shallow(name: str, device: str = "meta") -> torch.nn.Module:
    """The preset with every depth at most 2 (layers, a stage's blocks), on ``device``: a tensor made on the wrong
    device and a graph break come from code paths, which 2 layers exercise as 6 do (the cross-layer hooks need 2;
    a ResNet stage's first block changes the shape and its second keeps it; a Swin stage's second block shifts its
    windows), while the time to run or trace grows with depth. A preset whose method fixes its depth (an MPT
    permutation of 6 layers) is built whole."""
    with torch.device(device):
        try:
            return create_model(name, **shallower(get_config(name).to_dict()))
        except ConfigError:
            return create_model(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_model_runs_forward_and_backward_on_the_meta_device(name):
    model = shallow(name).train()
    args, kwargs = example_inputs(model, "meta")
    scalar_loss(model(*args, **kwargs)).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is None or g.device.type == "meta" for g in grads)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_model_compiles_without_graph_breaks(name):
    torch._dynamo.reset()
    model = shallow(name).train()
    args, kwargs = example_inputs(model, "meta")
    explanation = torch._dynamo.explain(model)(*args, **kwargs)
    reasons = [str(reason.reason).splitlines()[0] for reason in explanation.break_reasons]
    assert explanation.graph_break_count == 0, reasons


# one preset per method and the language model: inductor's CUDA build takes tens of seconds a model
INDUCTOR_PRESETS = ["gpt_shakespeare_char", "transformer_iwslt_de_en", "pa_transformer_iwslt_de_en",
                    "crossformer_iwslt_key_query", "mpt_soft_small", "lw_mcan_1x"]


@gpu
@pytest.mark.parametrize("name", INDUCTOR_PRESETS)
def test_models_compile_with_inductor_on_cuda_in_one_graph(name, monkeypatch):
    """What ``train.compile`` does on a GPU: inductor, bf16 autocast, a training step; ``fullgraph=True`` raises at
    any graph break, and the compiled loss and gradients match the eager ones to bf16 rounding."""
    torch._dynamo.reset()
    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)  # eager's dropout masks, seed for seed
    torch.manual_seed(0)
    model = shallow(name, "cuda").train()
    args, kwargs = example_inputs(model, "cuda")
    compiled = torch.compile(model, fullgraph=True)
    losses, grads = [], []
    for run in (model, compiled):
        torch.manual_seed(1)  # the same dropout masks in both runs
        model.zero_grad(set_to_none=True)
        with autocast(torch.device("cuda"), "bf16"):
            output = run(*args, **kwargs)
            logits = output if isinstance(output, torch.Tensor) else output.logits
            # positive terms only: a plain sum of logits can cancel to near zero and make the comparison noise
            loss = logits.float().square().mean() + sum(getattr(output, "aux_losses", {}).values())
        loss.backward()
        losses.append(loss.detach().float())
        grads.append(torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=1e-2)
    assert (grads[1] - grads[0]).norm() <= 2e-2 * grads[0].norm()


def test_a_host_sync_in_the_forward_pass_fails_the_meta_test(monkeypatch):
    """The meta test is only worth something if a host synchronisation really fails it."""
    from interlayer.core import attention

    original = attention._rows_without_keys

    def syncing(allowed, key_padding_mask, causal):
        if key_padding_mask is not None and bool(key_padding_mask.all(-1).any()):
            return key_padding_mask.all(-1)[:, None, None, None]
        return original(allowed, key_padding_mask, causal)

    monkeypatch.setattr(attention, "_rows_without_keys", syncing)
    with pytest.raises(RuntimeError, match="meta"):
        test_every_model_runs_forward_and_backward_on_the_meta_device("transformer_small")


def test_decoding_creates_every_tensor_on_its_input_device():
    """Greedy and beam search, with and without the cache, on CPU inputs while the default device is meta: a
    tensor created without ``device=`` would land on meta and fail to meet the CPU ones."""
    from interlayer import create_model
    from interlayer.tasks.translation_decoding import DecodeOptions, decode

    model = create_model("transformer_small", src_vocab_size=40, d_model=32, d_ffn=64, n_heads=2, enc_layers=1,
                         dec_layers=1).eval()
    src = torch.randint(4, 40, (3, 6))
    src[2, 4:] = model.config.pad_id
    options = [DecodeOptions(beam=beam, use_cache=cache, max_len_a=0.0, max_len_b=5) for beam in (1, 3)
               for cache in (True, False)]
    expected = [decode(model, src, option) for option in options]
    with torch.device("meta"):
        got = [decode(model, src, option) for option in options]
    assert got == expected


def test_move_reaches_tensors_inside_containers_and_dataclasses():
    from dataclasses import dataclass

    @dataclass
    class Batch:
        tokens: torch.Tensor
        parts: list
        count: int

    batch = Batch(torch.ones(2), [torch.zeros(1), {"x": torch.ones(1)}], 3)
    moved = move(batch, torch.device("meta"))
    assert moved.tokens.is_meta and moved.parts[0].is_meta and moved.parts[1]["x"].is_meta and moved.count == 3
    assert batch.tokens.device.type == "cpu"  # the original is untouched
    # what is already there comes back as the same objects: moving twice is free, and an object the caller keeps
    # (a KV cache the model fills in place) is not swapped for a copy
    assert move(moved, torch.device("meta")) is moved and move(batch.parts, torch.device("cpu")) is batch.parts


def test_generation_under_the_validation_hook_fills_the_callers_caches():
    """The engine's validation hook moves every call's inputs; decoding with the KV cache through it must still
    fill the caches the loop keeps (a copy would decode from an empty cache every step)."""
    from helpers.lm import lm
    from interlayer.core.generation import SamplingOptions, generate
    from interlayer.training.device import inputs_to

    model = lm()
    prompts = torch.tensor([[5, 9, 2], [4, 8, 1]])
    options = [SamplingOptions(max_new_tokens=6, temperature=0, **kw) for kw in ({}, {"static_cache": False})]
    expected = generate(model, prompts, SamplingOptions(max_new_tokens=6, temperature=0, use_cache=False)).tokens
    with inputs_to(model, torch.device("cpu")):
        assert all(torch.equal(generate(model, prompts, option).tokens, expected) for option in options)


def test_device_and_precision_resolve_with_errors_that_name_the_choices():
    # one canonical form whatever the name: the device a tensor placed there reports (cuda:0, not cuda)
    for name in ["auto", "cpu", "meta"] + (["cuda", "cuda:0"] if torch.cuda.is_available() else []):
        device = resolve_device(name)
        assert torch.empty(0, device=device).device == device, name
    assert resolve_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else
                                      resolve_device("mps") if torch.backends.mps.is_available() else
                                      torch.device("cpu"))
    if torch.cuda.is_available():
        assert resolve_device("cuda") == resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
    with pytest.raises(ConfigError, match="choose auto, cpu, cuda"):
        resolve_device("tpu9")
    with pytest.raises(ConfigError, match="choose one of"):
        resolve_precision("fp8", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda:0")
    with autocast(torch.device("cpu"), "bf16"):
        assert torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32


def test_compare_spreads_runs_over_the_gpus(monkeypatch):
    """``compare --jobs N`` on a machine with GPUs: each new run goes to the least busy GPU, unless the runs' device
    names one device."""
    from interlayer.compare.runner import gpus_for_runs, least_busy

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert gpus_for_runs("auto") == gpus_for_runs("cuda") == gpus_for_runs(None) == [0, 1, 2]
    assert gpus_for_runs("cuda:1") == gpus_for_runs("cpu") == []
    assert least_busy([0, 1, 2], []) == 0 and least_busy([0, 1, 2], [0]) == 1 and least_busy([0, 1, 2], [0, 1]) == 2
    assert least_busy([0, 1, 2], [0, 1, 2, 1]) == 0 and least_busy([], [None]) is None
