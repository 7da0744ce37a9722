"""Attention-augmented ResNets (models/aa_resnet.py) and Predictive Attention across their augmented layers (PA
Sec. 4.2.2): the AA layer against a loop written from the AA paper's equations, PA-AA at alpha = 0 equal to AA, the
maps' resizing, the counts of PA Table 4's networks."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from interlayer import count_madds, count_parameters, create_model, get_config, load_pretrained, save_pretrained
from interlayer.core.config import ConfigError
from interlayer.methods.predictive import PredictiveMixer
from interlayer.models.aa_resnet import AugmentedConv, resize_maps
from interlayer.papers.predictive import _TABLE_4

SMALL = dict(image_height=12, image_width=12)  # the CPU preset's stages at 12, 6 and 3 pixels


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def aa_loop(layer, x):
    """AA Eq. 1-4 and Sec. 3.3 pixel by pixel: per head ``h`` and query pixel ``i``, ``l_ij = q_i^T (k_j +
    r^W_{jx-ix} + r^H_{jy-iy}) / sqrt(d_k^h)`` over every key pixel ``j``, the softmax over ``j``, the weighted sum
    of the values; the heads concatenated and mixed by ``W^O`` (Eq. 2); then ``Concat[Conv(X), MHA(X)]``."""
    att = layer.attention
    heads, dk, dv = att.n_heads, att.qk_dim, att.d_model
    dkh, dvh = dk // heads, dv // heads
    r_h, r_w = att.relative.e_h, att.relative.e_w
    batch, _, height, width = x.shape
    outputs = []
    for b in range(batch):
        pixel = x[b].permute(1, 2, 0)  # (H, W, F_in)
        mha = []
        for iy in range(height):
            for ix in range(width):
                o = []
                for h in range(heads):
                    def project(proj, j, d):
                        return proj.weight[h * d:(h + 1) * d] @ pixel[j] + proj.bias[h * d:(h + 1) * d]
                    q = project(att.q_proj, (iy, ix), dkh)
                    logits, values = [], []
                    for jy in range(height):
                        for jx in range(width):
                            k = project(att.k_proj, (jy, jx), dkh)
                            rel = r_w[jx - ix + width - 1] + r_h[jy - iy + height - 1]
                            logits.append(q @ (k + rel) / math.sqrt(dkh))
                            values.append(project(att.v_proj, (jy, jx), dvh))
                    weights = torch.softmax(torch.stack(logits), 0)
                    o.append((weights[:, None] * torch.stack(values)).sum(0))
                mha.append(att.out_proj.weight @ torch.cat(o) + att.out_proj.bias)
        outputs.append(torch.stack(mha).T.reshape(dv, height, width))
    return torch.cat([layer.conv(x), torch.stack(outputs)], dim=1)


def test_the_augmented_convolution_is_the_aa_papers():
    torch.manual_seed(0)
    layer = AugmentedConv(5, 8, 1, (3, 4), heads=2, key_depth=4, value_depth=4, relative=True, pool=False,
                          logit_mixer=None)
    x = torch.randn(1, 5, 3, 4, requires_grad=True)
    ours, _ = layer(x)
    reference = aa_loop(layer, x)
    assert ours.shape == (1, 8, 3, 4)
    assert torch.allclose(ours, reference, atol=1e-5)
    grad = torch.randn_like(ours)
    ours_grads = torch.autograd.grad(ours, [x, layer.attention.q_proj.weight, layer.attention.relative.e_h], grad)
    reference_grads = torch.autograd.grad(reference, [x, layer.attention.q_proj.weight,
                                                      layer.attention.relative.e_h], grad)
    for a, b in zip(ours_grads, reference_grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_resize_maps_averages_the_merged_queries_and_keys():
    maps = torch.randn(2, 3, 16, 16)
    resized = resize_maps(maps, (4, 4), (2, 2))
    grid = maps.view(2, 3, 4, 4, 4, 4)  # (b, h, query row, query col, key row, key col)
    for qy, qx, ky, kx in [(0, 0, 0, 0), (1, 0, 0, 1), (1, 1, 1, 0)]:
        block = grid[:, :, 2 * qy:2 * qy + 2, 2 * qx:2 * qx + 2, 2 * ky:2 * ky + 2, 2 * kx:2 * kx + 2]
        assert torch.allclose(resized[:, :, qy * 2 + qx, ky * 2 + kx], block.mean(dim=(2, 3, 4, 5)), atol=1e-6)
    assert torch.equal(resize_maps(maps, (4, 4), (4, 4)), maps)


def _live(model):
    """``model`` with every batch norm's scale drawn: each block's last one starts at 0 (the block is the identity
    at initialisation), which would hide what the attention does."""
    for norm in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    return model.eval()


def test_pa_aa_at_alpha_zero_is_aa():
    torch.manual_seed(0)
    aa = _live(create_model("aa_resnet_fashion_mnist", **SMALL))
    pa = create_model("pa_aa_resnet_fashion_mnist", **SMALL, **{"predictive.alpha": 0.0}).eval()
    missing, unexpected = pa.load_state_dict(aa.state_dict(), strict=False)
    assert not unexpected and missing and all("logit_mixer" in name for name in missing)
    images = torch.randint(0, 256, (3, 1, 12, 12), dtype=torch.uint8)
    plain, mixed = aa(images, output_attentions=True), pa(images, output_attentions=True)
    assert torch.allclose(mixed.logits, plain.logits, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(mixed.attentions, plain.attentions))
    pa_on = create_model("pa_aa_resnet_fashion_mnist", **SMALL).eval()
    pa_on.load_state_dict(pa.state_dict())
    predicted = pa_on(images, output_attentions=True).attentions
    assert torch.equal(predicted[0], plain.attentions[0])  # the first augmented layer predicts nothing
    # near-uniform maps at initialisation: the prediction moves them by 7-14% of their largest probability here
    assert all((a - b).abs().max() > 0.03 * b.max() for a, b in zip(predicted[1:], plain.attentions[1:]))


def _mixer_calls(model, images):
    calls = []
    for mixer in (m for m in model.modules() if isinstance(m, PredictiveMixer)):
        mixer.register_forward_hook(lambda module, args, out: calls.append(tuple(args[1].shape)))
    model(images)
    return calls


def test_the_chain_crosses_stages_by_resizing_or_restarts():
    """The CPU preset's four augmented layers, two at 6 x 6 and two at 3 x 3 (here, unpooled); three predict."""
    images = torch.randint(0, 256, (2, 1, 12, 12), dtype=torch.uint8)
    full = dict(SMALL, attention_pool=[False] * 3)  # the 6 x 6 stage attends at 6 x 6
    area = create_model("pa_aa_resnet_fashion_mnist", **full)
    assert _mixer_calls(area, images) == [(2, 4, 36, 36), (2, 4, 9, 9), (2, 4, 9, 9)]
    assert _mixer_calls(create_model("pa_aa_resnet_fashion_mnist", **SMALL), images) == [(2, 4, 9, 9)] * 3
    restart = create_model("pa_aa_resnet_fashion_mnist", map_resize="restart", **full)
    assert _mixer_calls(restart, images) == [(2, 4, 36, 36), (2, 4, 9, 9)]


@pytest.mark.parametrize("preset, overrides", [
    ("aa_resnet_fashion_mnist", dict(SMALL)),
    ("pa_aa_resnet_fashion_mnist", dict(SMALL)),
    # bottlenecks, a strided augmented 3 x 3 (its attention reads the pooled input), a pooled attention stage
    ("pa_aa_resnet50", dict(image_height=64, image_width=48, channels=1, pixel_mean=[0.0], pixel_std=[1.0],
                            layers=[1, 2, 1, 1], widths=[8, 16, 16, 32], stem_width=8, num_classes=5)),
])
def test_madds_match_the_flop_counter(preset, overrides):
    model = create_model(preset, **overrides).eval()
    cfg = model.config
    with FlopCounterMode(display=False) as counter:
        model(torch.rand(2, cfg.channels, cfg.image_height, cfg.image_width))
    assert counter.get_total_flops() == 2 * 2 * count_madds(model, cfg.tokens)


@pytest.mark.slow
def test_table_4_baselines_are_the_resnets_and_pa_adds_what_the_paper_adds():
    def counts(preset, **overrides):
        with torch.device("meta"):
            model = create_model(preset, **overrides)
        return count_parameters(model), 2 * model.madds() / 1e9

    plain = dict(augmented=[False] * 4, attention_pool=[False] * 4)
    assert counts("aa_resnet50", **plain) == (25_557_032, pytest.approx(8.18, abs=0.01))  # torchvision's resnet50
    assert counts("aa_resnet34", **plain)[0] == 21_797_672
    assert round(counts("pa_aa_resnet50")[1] - counts("aa_resnet50")[1], 1) == 0.4  # paper: 8.3 -> 8.7
    two = counts("pa_aa_resnet34", **{"predictive.conv_layers": 2})[1]
    assert round(two - counts("aa_resnet34")[1], 1) == 0.8  # paper: 7.1 -> 7.9, two convolutions (App. B.3.2)
    assert [row[1] for row in _TABLE_4][:4] == [
        "ResNet-34", "AA-ResNet-34", "PA-AA-ResNet-34", "PA-AA-ResNet-34, 2 convolutions (App. B.3.2)"]


def test_aa_configs_are_validated():
    with pytest.raises(ConfigError, match="needs one entry per stage"):
        get_config("aa_resnet_fashion_mnist", widths=[16, 32])
    with pytest.raises(ConfigError, match="upsilon=0.99 .* leaves the convolution none"):
        get_config("aa_resnet_fashion_mnist", upsilon=0.99)
    with pytest.raises(ConfigError, match="at least 2 augmented"):
        get_config("pa_aa_resnet_fashion_mnist", augmented=[False, False, True], layers=[2, 2, 1],
                   attention_pool=[False] * 3)
    with pytest.raises(ConfigError, match="predictive.alpha=2"):
        get_config("pa_aa_resnet_fashion_mnist", **{"predictive.alpha": 2})


def test_a_saved_pa_aa_resnet_loads_and_trains(tmp_path):
    model = create_model("pa_aa_resnet_fashion_mnist", **SMALL)
    save_pretrained(model.eval(), tmp_path)
    loaded = load_pretrained(tmp_path)
    images = torch.randint(0, 256, (2, 1, 12, 12), dtype=torch.uint8)
    assert torch.equal(model(images).logits, loaded(images).logits)
    out = loaded.train()(images, labels=torch.tensor([0, 3]), output_attentions=True)
    out.loss.backward()
    assert len(out.attentions) == 4 and out.attentions[0].shape == (2, 4, 9, 9)  # the 6 x 6 stage's, pooled
    assert all(p.grad is not None for p in loaded.parameters())
    assert count_parameters(loaded) == count_parameters(model)
    assert F.softmax(out.logits, -1).shape == (2, 10)
