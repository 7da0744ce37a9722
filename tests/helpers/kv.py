"""A from-scratch pre-LN causal stack whose layers take their keys/values from a rule over the earlier layers':
the reference the value-residual and cross-layer-attention tests compare the library with."""
import math

import torch
import torch.nn.functional as F


def _heads(x, h):
    b, t, d = x.shape
    return x.view(b, t, h, d // h).transpose(1, 2)


def _linear(x, proj):
    return F.linear(x, proj.weight, proj.bias)


def reference_layers(model, x, rule, causal=True):
    """The pre-LN stack written out: attention with the keys/values ``rule(i, k, v, ks, vs)`` gives, from the
    layer's own ``k``/``v`` (None without a projection) and the earlier layers' ``ks``/``vs``."""
    ks, vs = [], []
    for i, layer in enumerate(model.encoder.layers):
        att = layer.self_attn
        a = layer.attn_block.norm(x)
        b = getattr(layer.attn_block, "kv_norm", layer.attn_block.norm)(x)  # CLA Sec. 3.1: the K/V side's own norm
        h = att.n_heads
        q = _heads(_linear(a, att.q_proj), h)
        k = _heads(_linear(b, att.k_proj), h) if att.k_proj is not None else None
        v = _heads(_linear(b, att.v_proj), h) if att.v_proj is not None else None
        k, v = rule(i, k, v, ks, vs)
        ks.append(k)
        vs.append(v)
        logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            t = x.shape[1]
            logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
        x = x + _linear(out, att.out_proj)
        x = x + layer.ffn(layer.ffn_block.norm(x))
    return x


def reference_logits(model, tokens, rule):
    x = reference_layers(model, model.encoder.embed(tokens), rule)
    return model.lm_head(model.encoder.final_norm(x))
