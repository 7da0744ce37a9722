"""The tiny causal language model the method tests share, and the properties every method must keep on it:
causality (a later token never changes an earlier output), cache-exactness (decoding step by step with the KV
cache gives the full forward pass's logits), and generation that does not depend on the cache or on padding."""
import copy

import torch

from interlayer import create_model
from interlayer.core.generation import SamplingOptions, generate
from interlayer.methods import METHODS

TINY = dict(src_vocab_size=40, d_model=32, n_heads=4, d_ffn=64, enc_layers=4, max_positions=32, dropout=0.0,
            attn_dropout=0.0)
T, CHANGED = 12, 6
# Every method's causal-LM examples (``Method.lm_examples``) by example name, as the overrides lm() takes: the tests
# that run "every method" on a language model read them, so a new method is covered once it declares its own.
LM_EXAMPLES = {name: {method.name: copy.deepcopy(dict(section))}
               for method in METHODS for name, section in method.lm_examples.items()}


def lm(**overrides):
    torch.manual_seed(0)
    return create_model("gpt_shakespeare_char", **copy.deepcopy({**TINY, **overrides})).eval()


def assert_causal(model) -> None:
    """Token CHANGED altered: positions < CHANGED unchanged bit for bit, later ones changed."""
    tokens = torch.randint(0, 40, (2, T))
    later = tokens.clone()
    later[:, CHANGED] = (later[:, CHANGED] + 1) % 40
    a, b = model(tokens).logits, model(later).logits
    assert torch.equal(a[:, :CHANGED], b[:, :CHANGED])
    assert not torch.allclose(a[:, CHANGED:], b[:, CHANGED:])


def assert_cache_matches(model):
    """Prompt, then token by token with the cache: the logits of the full forward, and causal in the cache too.
    Returns the filled cache, for what a test checks it holds."""
    tokens = torch.randint(0, 40, (2, T))
    full = model(tokens).logits
    cache = model.new_cache()
    steps = [model(tokens[:, :3], cache=cache).logits] + [model(tokens[:, i:i + 1], cache=cache).logits
                                                           for i in range(3, T)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    return cache


def assert_padded_generation_matches(model) -> None:
    """Greedy continuations of three prompts of different lengths: the same with and without the cache, and the
    same in one right-padded batch (with its padding mask) as alone."""
    greedy = SamplingOptions(max_new_tokens=6, temperature=0)
    prompts = [[5, 9, 2, 7, 1], [4, 8], [11, 12, 13]]
    alone = [generate(model, torch.tensor([p]), greedy).tokens[0] for p in prompts]
    uncached = [generate(model, torch.tensor([p]), SamplingOptions(max_new_tokens=6, temperature=0,
                                                                   use_cache=False)).tokens[0] for p in prompts]
    assert all(torch.equal(a, u) for a, u in zip(alone, uncached))
    rows = torch.tensor([p + [0] * (5 - len(p)) for p in prompts])
    mask = torch.tensor([[False] * len(p) + [True] * (5 - len(p)) for p in prompts])
    batched = generate(model, rows, greedy, padding_mask=mask).tokens
    assert all(torch.equal(row, a) for row, a in zip(batched, alone))


def assert_seq2seq_cache_matches(model) -> None:
    """An encoder-decoder decoding its target token by token with the decoder's cache gives the teacher-forced
    forward pass's logits."""
    src, tgt = torch.randint(4, 50, (2, 7)), torch.randint(4, 50, (2, 6))
    with torch.no_grad():
        full = model(src, tgt).logits
        enc = model.encode(src)
        cache = model.decoder.new_cache()
        steps = [model.decode(tgt[:, i:i + 1], enc, cache=cache).logits for i in range(tgt.shape[1])]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
