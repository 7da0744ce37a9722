"""The tiny causal language model the method tests share, and the two properties every method must keep on it:
causality (a later token never changes an earlier output) and cache-exactness (decoding step by step with the KV
cache gives the full forward pass's logits)."""
import torch

from interlayer import create_model

TINY = dict(src_vocab_size=40, d_model=32, n_heads=4, d_ffn=64, enc_layers=4, max_positions=32, dropout=0.0,
            attn_dropout=0.0)
T, CHANGED = 12, 6


def lm(**overrides):
    torch.manual_seed(0)
    return create_model("gpt_shakespeare_char", **{**TINY, **overrides}).eval()


def assert_causal(model) -> None:
    """Token CHANGED altered: positions < CHANGED unchanged bit for bit, later ones changed."""
    tokens = torch.randint(0, 40, (2, T))
    later = tokens.clone()
    later[:, CHANGED] = (later[:, CHANGED] + 1) % 40
    a, b = model(tokens).logits, model(later).logits
    assert torch.equal(a[:, :CHANGED], b[:, :CHANGED])
    assert not torch.allclose(a[:, CHANGED:], b[:, CHANGED:])


def assert_cache_matches(model) -> None:
    """Prompt, then token by token with the cache: the logits of the full forward, and causal in the cache too."""
    tokens = torch.randint(0, 40, (2, T))
    full = model(tokens).logits
    cache = model.new_cache()
    steps = [model(tokens[:, :3], cache=cache).logits] + [model(tokens[:, i:i + 1], cache=cache).logits
                                                           for i in range(3, T)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
