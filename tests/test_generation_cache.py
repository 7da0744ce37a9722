"""Fast decoding (core/generation.py, KVCache in core/attention.py): the static cache written in place, the compiled
fixed-shape step, and stopping checked every few tokens, each against the recomputing path, for every method that
keeps a cache. The compiled step is traced with dynamo's eager backend here (``fullgraph=True``: a graph break
fails); inductor and CUDA graphs are measured by benchmarks/bench_generate.py on a GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo

from helpers.lm import LM_EXAMPLES, lm
from interlayer.core import generation
from interlayer.core.attention import KVCache
from interlayer.core.generation import SamplingOptions, generate
from interlayer.methods import METHODS

ROOT = Path(__file__).resolve().parents[1]

# three prompts of lengths 5, 2 and 3, right-padded (each continued as alone: tests/test_core_lm.py)
PROMPTS = torch.tensor([[5, 9, 2, 7, 1], [4, 8, 0, 0, 0], [11, 12, 13, 0, 0]])
PADDING = PROMPTS.eq(0) & (torch.arange(5) >= torch.tensor([[5], [2], [3]]))
COMPILED = dict(compile=True, compile_backend="eager")
GREEDY = dict(max_new_tokens=8, temperature=0)
# the core's position schemes beside every method's language-model examples (Method.lm_examples)
POSITIONS = {"rotary": dict(positions="rotary"), "shaw_relative": dict(positions="relative")}
CASES = {"plain": {}, **POSITIONS, **LM_EXAMPLES}


def fixed_shape(model) -> bool:
    """What the model declares of its caches, read as the compiled step reads it (core/generation.py): it keeps a
    KV cache at all (``supports_cache``: not Multi-Pass, whose layers run twice) and no layer mixes logits
    (Predictive Attention's convolution state grows with the keys)."""
    return model.supports_cache and all(getattr(layer.self_attn, "logit_mixer", None) is None
                                        for layer in model.encoder.layers)


def _conflicting(a: str, b: str) -> bool:
    """Whether the methods of examples ``a`` and ``b`` are one method, or one declares a conflict with the other."""
    first, second = (next(m for m in METHODS if name in m.lm_examples) for name in (a, b))
    return first is second or any(c.other in {e.name for e in y.examples}
                                  for x, y in ((first, second), (second, first)) for c in x.conflicts)


def _compiled_models() -> dict[str, dict]:
    """Every example with a fixed-shape cache packed into as few 2-layer models as the declared conflicts allow
    (tracing a model takes seconds), each with one of the core's position schemes in turn."""
    groups: list[list[str]] = []
    for name in (n for n, overrides in LM_EXAMPLES.items() if fixed_shape(lm(enc_layers=2, **overrides))):
        group = next((g for g in groups if not any(_conflicting(name, other) for other in g)), None)
        if group is None:
            groups.append([name])
        else:
            group.append(name)
    positions = [{}, *POSITIONS.values()]
    return {"_".join(g): {k: v for name in g for k, v in LM_EXAMPLES[name].items()} | positions[i % len(positions)]
            for i, g in enumerate(groups)}


COMBINED = _compiled_models()


def decode(model, options: SamplingOptions, prompts=PROMPTS, padding=PADDING, seed=None):
    torch._dynamo.reset()  # each compiled case traces afresh (and dynamo's recompile limit never binds)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return generate(model, prompts, options, padding_mask=padding, generator=generator)


@pytest.mark.parametrize("case", list(CASES))
def test_static_and_growing_caches_give_the_recomputed_tokens(case):
    """Padded prompts, greedy: the growing and the static cache continue every row with the tokens of reading the
    whole prefix again, for each method that keeps a cache; one that keeps none refuses a cache and decodes by
    recomputing."""
    model = lm(**CASES[case])
    if not model.supports_cache:
        with pytest.raises(ValueError, match="use_cache=False"):
            model.new_cache()
    expected = decode(model, SamplingOptions(**GREEDY, use_cache=False)).tokens
    for setting in (dict(static_cache=False), {}):
        assert torch.equal(decode(model, SamplingOptions(**GREEDY, **setting)).tokens, expected), setting


@pytest.mark.parametrize("case", list(CASES))
def test_fixed_shape_cache_steps_give_the_full_forward_logits(case):
    """The compiled step's cache layout, run eagerly: the prompt and then one token per step, each attending to the
    whole capacity at the position a tensor holds, give the logits of the full forward pass (rotary and relative
    positions read the tensor; ResFormer mixes the first layer's values at it). A model without a fixed-shape cache
    (:func:`fixed_shape`) refuses it with the reason: no cache at all, or a compiled step over one."""
    model = lm(**CASES[case])
    if not model.supports_cache:
        with pytest.raises(ValueError, match="use_cache=False"):
            model.new_cache(capacity=16)
        return
    if not fixed_shape(model):
        with pytest.raises(ValueError, match="generate with compile=False"):
            generate(model, PROMPTS, SamplingOptions(max_new_tokens=2, **COMPILED))
        return
    tokens = torch.randint(0, 40, (2, 12))
    full = model(tokens).logits
    position = torch.zeros((), dtype=torch.long)
    cache = model.new_cache(capacity=16)
    for layer in cache:
        layer.position = position
    steps = [model(tokens[:, :3], cache=cache, position_ids=torch.arange(3).expand(2, 3)).logits]
    position.fill_(3)
    for i in range(3, 12):
        steps.append(model(tokens[:, i:i + 1], cache=cache, position_ids=torch.full((2, 1), i)).logits)
        position.add_(1)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-6)
    assert all(t.shape[2] == 16 for layer in cache for t in layer.buffers.values())


@pytest.mark.slow
@pytest.mark.parametrize("methods", list(COMBINED))
def test_the_compiled_step_gives_the_recomputed_tokens(methods):
    """The same with the compiled fixed-shape step (one graph, attending to the whole capacity, positions from a
    tensor), for every example with a fixed-shape cache (the others are refused: the test above)."""
    model = lm(enc_layers=2, **COMBINED[methods])
    expected = decode(model, SamplingOptions(**GREEDY, use_cache=False)).tokens
    assert torch.equal(decode(model, SamplingOptions(**GREEDY, **COMPILED)).tokens, expected)


@pytest.mark.slow
def test_sampling_past_the_context_is_the_same_with_every_decoder():
    """Top-k, top-p and temperature from one seed, and more new tokens than the context holds (the window slides
    once the cache is full): the same draws, whichever decoder computes the logits."""
    model = lm(enc_layers=2, max_positions=16, positions="rotary")
    sampled = dict(max_new_tokens=20, temperature=0.8, top_k=10, top_p=0.9)
    expected = decode(model, SamplingOptions(**sampled, use_cache=False), seed=3).tokens
    for setting in (dict(static_cache=False), {}, COMPILED):
        assert torch.equal(decode(model, SamplingOptions(**sampled, **setting), seed=3).tokens, expected), setting


def test_the_static_cache_is_written_in_place_without_concatenation(monkeypatch):
    """Every step writes into the buffers allocated at the first one: their addresses never change, the keys and
    values attention reads are views of them, and nothing is concatenated along the positions (``torch.cat`` on
    dimension 2 would raise)."""
    model = lm()
    prompt = torch.tensor([[5, 9, 2]])
    cache = model.new_cache(capacity=8)
    expected = model(torch.tensor([[5, 9, 2, 7, 1, 3, 3, 6]])).logits
    steps = [model(prompt, cache=cache).logits]
    addresses = [{name: t.data_ptr() for name, t in layer.buffers.items()} for layer in cache]
    allocated = sum(layer.allocated_bytes for layer in cache)
    cat = torch.cat

    def no_cat_along_positions(tensors, dim=0, **kwargs):
        if dim == 2:
            pytest.fail("a static cache step concatenated keys or values")
        return cat(tensors, dim, **kwargs)

    monkeypatch.setattr(torch, "cat", no_cat_along_positions)
    for token in (7, 1, 3, 3, 6):
        steps.append(model(torch.tensor([[token]]), cache=cache).logits)
        assert [{name: t.data_ptr() for name, t in layer.buffers.items()} for layer in cache] == addresses
        assert all(layer.k.data_ptr() == layer.buffers["k"].data_ptr() for layer in cache)
    monkeypatch.undo()
    assert sum(layer.allocated_bytes for layer in cache) == allocated == 4 * 2 * 8 * 32 * 4  # layers, k+v, 8 x d
    assert cache[0].length == 8 and torch.allclose(torch.cat(steps, dim=1), expected, atol=1e-5)
    with pytest.raises(ValueError, match="holds 8 positions; 9 were written"):
        model(torch.tensor([[2]]), cache=cache)


def test_a_cla_layer_that_reuses_keys_stores_nothing_in_the_static_cache():
    model = lm(cla={"sharing_factor": 2}, value_residual={"mode": "svformer"})
    cache = model.new_cache(capacity=6)
    model(torch.tensor([[5, 9, 2]]), cache=cache)
    model(torch.tensor([[4]]), cache=cache)
    # layers 0 and 2 lead their CLA groups (layer 2 keeps keys only: SVFormer reads layer 0's values)
    assert [sorted(layer.buffers) for layer in cache] == [["k", "v"], [], ["k"], []]
    assert [layer.length for layer in cache] == [4, 0, 4, 0]


@pytest.mark.slow
def test_the_compiled_step_is_one_graph_reused_by_the_next_call_of_the_same_shapes():
    """A counting backend sees one graph (dynamo's fullgraph trace of the step) for two calls of the same batch
    size and capacity, whose caches keep their addresses; another batch size compiles again."""
    graphs = []

    def counting(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    model = lm(enc_layers=2)
    options = SamplingOptions(max_new_tokens=6, temperature=0, compile=True, compile_backend=counting)
    first = generate(model, PROMPTS, options, padding_mask=PADDING).tokens
    uncached = SamplingOptions(max_new_tokens=6, temperature=0, use_cache=False)
    assert torch.equal(first, generate(model, PROMPTS, uncached, padding_mask=PADDING).tokens)
    step = generation._STEPS[model][1]
    addresses = [t.data_ptr() for layer in step.caches for t in layer.buffers.values()]
    assert len(graphs) == 1 and step.capacity == 32  # 5 + 6 - 1 positions rounded up, at most max_positions
    # the graph writes the buffers in place: CUDA graphs need them at fixed addresses, marked static for dynamo
    assert all(getattr(t, "_dynamo_static_input_type", None) for layer in step.caches for t in layer.buffers.values())
    second = generate(model, PROMPTS, options, padding_mask=PADDING).tokens
    assert len(graphs) == 1 and generation._STEPS[model][1] is step and torch.equal(first, second)
    assert [t.data_ptr() for layer in step.caches for t in layer.buffers.values()] == addresses
    generate(model, PROMPTS[:2], options, padding_mask=PADDING[:2])
    assert len(graphs) == 2
    generation.release_compiled_step(model)
    assert model not in generation._STEPS


@pytest.mark.parametrize("setting", [{}, dict(static_cache=False), dict(use_cache=False), COMPILED])
def test_no_new_tokens_asked_gives_none(setting):
    out = generate(lm(), torch.tensor([[5]]), SamplingOptions(max_new_tokens=0, **setting))
    assert out.tokens.shape == (1, 0) and out.lengths.tolist() == [0]


def test_stopping_is_checked_every_few_tokens_with_the_result_of_stopping_at_once(monkeypatch):
    """Both rows produce EOS at their third token: checking every token stops after it; checking every 4 tokens
    runs one step more, and the result is cut back to the same tokens and lengths."""
    model = lm()
    prompts = torch.tensor([[5, 9, 2], [5, 9, 2]])
    free = generate(model, prompts, SamplingOptions(max_new_tokens=8, temperature=0)).tokens
    eos = int(free[0, 2])
    assert eos not in free[0, :2].tolist()
    steps = []
    real_next = generation.Cached.next
    monkeypatch.setattr(generation.Cached, "next", lambda self, chosen: steps.append(1) or real_next(self, chosen))
    results = []
    for interval in (1, 4):
        steps.clear()
        out = generate(model, prompts, SamplingOptions(max_new_tokens=8, temperature=0, eos_id=eos,
                                                       stop_check_interval=interval))
        results.append((out.tokens.tolist(), out.lengths.tolist(), len(steps) + 1))
    assert results[0] == (free[:, :3].tolist(), [3, 3], 3)
    assert results[1] == (free[:, :3].tolist(), [3, 3], 4)


def test_predictive_attention_is_refused_by_the_compiled_step_with_the_reason():
    model = lm(predictive={"conv_layers": 1, "alpha": 0.5})
    with pytest.raises(ValueError, match=r"layers \[1, 2, 3\] mix logits .* compile=False"):
        generate(model, PROMPTS, SamplingOptions(max_new_tokens=2, **COMPILED))


@pytest.mark.parametrize("options, message", [
    (SamplingOptions(compile=True, use_cache=False), "compile=True compiles the step over a static KV cache"),
    (SamplingOptions(compile=True, static_cache=False), "static_cache=False"),
    (SamplingOptions(stop_check_interval=0), "stop_check_interval=0")])
def test_bad_decoding_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        generate(lm(), PROMPTS, options)


def test_a_capacity_beyond_the_context_is_refused():
    with pytest.raises(ValueError, match="capacity=33 must lie in 1..max_positions=32"):
        lm().new_cache(capacity=33)


@pytest.mark.slow
def test_static_decoding_creates_every_tensor_on_its_input_device():
    """CPU model and prompts while the default device is meta: a buffer or position made without ``device=``
    would land on meta and fail to meet the CPU tensors."""
    model = lm(enc_layers=2, cla={"sharing_factor": 2})
    options = [SamplingOptions(max_new_tokens=4, temperature=0, **setting) for setting in ({}, COMPILED)]
    expected = [decode(model, option).tokens for option in options]
    with torch.device("meta"):
        got = [decode(model, option).tokens for option in options]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_reorder_selects_rows_of_a_static_cache_in_place():
    cache = KVCache(capacity=4)
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float).view(2, 1, 3, 2)
    cache.append(keys, keys + 100)
    address = cache.buffers["k"].data_ptr()
    cache.reorder(torch.tensor([1, 1]))
    assert cache.buffers["k"].data_ptr() == address and torch.equal(cache.k, keys[[1, 1]])
    assert torch.equal(cache.v, keys[[1, 1]] + 100) and cache.length == 3


@pytest.mark.slow
def test_bench_generate_dry_run_reports_every_part(tmp_path):
    """benchmarks/bench_generate.py --tiny: every setting warmed up and timed, each with the recomputed tokens; the
    cache's bytes per token (CLA2 half the plain model's); each variant's batch within the memory budget, larger
    for CLA2, and its speed there."""
    path = tmp_path / "generate.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_generate.py"), "--tiny", "--json",
                             str(path)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(path.read_text())
    settings = {(s["variant"], s["decoding"]): s for s in record["settings"]}
    assert set(settings) == {(v, d) for v in ("plain", "cla2") for d in ("recompute", "growing", "static",
                                                                          "compiled")}
    assert all(s["same_tokens"] and s["new_tokens_per_s"] > 0 for s in settings.values())
    per_token = {v: settings[v, "static"]["cache_bytes_per_token"] for v in ("plain", "cla2")}
    assert per_token["plain"] == 2 * per_token["cla2"] > 0
    budget = {b["variant"]: b for b in record["budget"]}
    assert 0 < budget["plain"]["batch"] < budget["cla2"]["batch"]
    assert all(b["new_tokens_per_s"] > 0 for b in budget.values())
