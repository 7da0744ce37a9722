"""Swin Transformer (models/swin.py) and LW-Swin (LW Table IX): equal to timm's Swin with the same weights, Swin-T's
size and MAdds, the window machinery, and the lightweight section reaching every block.

timm is no dependency of the suite (its torchvision does not import beside the CPU torch pinned here): where timm
imports, the two comparisons with it run; elsewhere they are skipped."""
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from interlayer import count_madds, count_parameters, create_model, get_config, load_pretrained, save_pretrained
from interlayer.core.config import ConfigError
from interlayer.methods.lightweight import GroupedMultiHeadAttention
from interlayer.models.swin import MASKED_LOGIT, WindowBias, shift_mask, window_partition, window_reverse
from interlayer.papers.lightweight import _table_ix_rows

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
# the CPU preset at 12 x 12 (padded to 16): an 8 x 8 grid, 4 x 4 windows, then one 4 x 4 window
TINY = dict(image_height=12, image_width=12, embed_dim=8, depths=[2, 2], heads=[2, 4])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _timm():
    """timm, the independent reference, where it imports: it is no dependency of the suite, since its torchvision
    (a CUDA build) fails to import beside the CPU torch the project's machines pin (``torchvision::nms does not
    exist``, a RuntimeError, not an ImportError). Run where timm imports: docs/vision-backbones.md."""
    try:
        import timm
    except Exception as error:  # noqa: BLE001 (ImportError, or torchvision's RuntimeError)
        pytest.skip(f"timm, the independent reference, does not import here: {str(error).splitlines()[0]}")
    return timm


def timm_state_dict(model):
    """Our Swin's weights under timm's names: q, k, v projections stacked into timm's ``qkv``."""
    renamed = {}
    for name, tensor in model.state_dict().items():
        name = name.replace("patch_embed.", "patch_embed.proj.").replace("embed_norm.", "patch_embed.norm.")
        name = name.replace("final_norm.", "norm.").replace("head.", "head.fc.")
        name = re.sub(r"^stages\.(\d+)\.merge\.", r"layers.\1.downsample.", name).replace("stages.", "layers.")
        name = name.replace(".self_attn.attention.relative.table", ".attn.relative_position_bias_table")
        name = name.replace(".self_attn.attention.out_proj.", ".attn.proj.").replace(".ffn.", ".mlp.")
        renamed[name.replace(".attn_block.norm.", ".norm1.").replace(".ffn_block.norm.", ".norm2.")] = tensor
    out = {}
    for name, tensor in renamed.items():
        match = re.match(r"(.*)\.self_attn\.attention\.q_proj\.(weight|bias)$", name)
        if match:
            prefix, kind = match.groups()
            out[f"{prefix}.attn.qkv.{kind}"] = torch.cat(
                [renamed[f"{prefix}.self_attn.attention.{p}_proj.{kind}"] for p in "qkv"])
        elif ".self_attn.attention." not in name:
            out[name] = tensor
    return out


def test_swin_t_equals_timm_with_the_same_weights():
    """The issue's bar. Slow for its import of timm (and torchvision): 3-5 s on a quiet machine."""
    timm = _timm()
    torch.manual_seed(0)
    ours = create_model("swin_t").eval()
    theirs = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    assert count_parameters(ours) == sum(p.numel() for p in theirs.parameters()) == 28_288_354
    theirs.load_state_dict(timm_state_dict(ours), strict=True)
    images = torch.rand(1, 3, 224, 224)
    with torch.no_grad():
        ours_logits = ours(images).logits
        theirs_logits = theirs((images - IMAGENET_MEAN) / IMAGENET_STD)
    assert torch.allclose(ours_logits, theirs_logits, atol=1e-5, rtol=0)


def test_the_cpu_swin_equals_timm_with_padding_and_clipped_windows():
    """The CPU preset's geometry (28 padded to 32, 2 x 2 patches, 4 x 4 windows, a last stage in one window)."""
    timm = _timm()
    torch.manual_seed(1)
    ours = create_model("swin_fashion_mnist", pixel_mean=[0.3], pixel_std=[0.5]).eval()
    theirs = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=32, patch_size=2,
                               in_chans=1, num_classes=10, embed_dim=32, depths=(2, 2, 2), num_heads=(2, 4, 8),
                               window_size=4).eval()
    theirs.load_state_dict(timm_state_dict(ours), strict=True)
    images = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8)
    padded = torch.nn.functional.pad(images.float() / 255, (2, 2, 2, 2))
    with torch.no_grad():
        assert torch.allclose(ours(images).logits, theirs((padded - 0.3) / 0.5), atol=1e-5, rtol=0)


def test_swin_t_counts_as_the_paper():
    """Sec. 3.3: Swin-T has 28M parameters and 4.5G FLOPs (multiply-adds) at 224 x 224; LW Table IX: 28.3M, 4.5G."""
    with torch.device("meta"):
        model = create_model("swin_t")
    assert round(count_parameters(model) / 1e6, 1) == 28.3
    assert round(model.madds() / 1e9, 1) == 4.5
    assert count_madds(model, model.config.tokens) == model.madds()
    with pytest.raises(ValueError, match="patch tokens"):
        model.madds(model.config.tokens + 1)


@pytest.mark.parametrize("overrides", [{}, {"lightweight": {"groups": 2, "share_weights": False}}])
def test_madds_match_the_flop_counter(overrides):
    model = create_model("swin_fashion_mnist", attn_impl="eager", **TINY, **overrides).eval()
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 256, (2, 1, 12, 12), dtype=torch.uint8))
    assert counter.get_total_flops() == 2 * 2 * count_madds(model, model.config.tokens)


def test_windows_partition_and_reverse():
    x = torch.arange(2 * 8 * 4 * 3.0).view(2, 8, 4, 3)
    windows = window_partition(x, (4, 2))
    assert windows.shape == (2 * 2 * 2, 8, 3)
    assert torch.equal(windows[1, :, 0], x[0, :4, 2:4, 0].reshape(-1))  # the second window: rows 0-3, cols 2-3
    assert torch.equal(window_reverse(windows, (4, 2), (8, 4)), x)


def test_shift_mask_separates_exactly_the_tokens_the_roll_brought_together():
    grid, window, shift = (8, 8), (4, 4), (2, 2)
    mask = shift_mask(grid, window, shift)
    assert mask.shape == (4, 16, 16) and torch.equal(mask, mask.transpose(1, 2))
    assert not mask[0].any()  # the top-left window holds no rolled token
    # every pair: masked iff the tokens' original positions are not in one region of the rolled map
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    original = torch.stack([(rows + 2) % 8, (cols + 2) % 8], -1)  # where each rolled position came from
    region = ((original >= 8 - 2).long() * torch.tensor([3, 1])).sum(-1)  # rolled in from the top/left edge
    same = window_partition(region[None, :, :, None].float(), window).squeeze(-1)
    expected = (same[:, :, None] != same[:, None, :]).float() * MASKED_LOGIT
    assert torch.equal(mask, expected)


def test_window_bias_reads_the_table_by_relative_offset():
    bias = WindowBias(heads=2, window=(2, 3), mask=None)
    table = bias(torch.zeros(1, 2, 6, 4), 0, 6)[0]
    # queries at (0, 0) and (1, 1) see keys at (0, 1) and (1, 2) at the same offset (0, 1) - (0, 0)
    assert torch.equal(table[:, 0, 1], table[:, 4, 5])
    assert not torch.equal(table[:, 0, 1], table[:, 1, 0])


def test_a_stage_that_fits_in_one_window_is_not_shifted():
    cfg = get_config("swin_t")
    assert cfg.stage_window(3) == ((7, 7), (0, 0)) and cfg.stage_window(0) == ((7, 7), (3, 3))
    model = create_model("swin_fashion_mnist", **TINY)
    shifted = [block.self_attn.shift for stage in model.stages for block in stage.blocks]
    assert shifted == [(0, 0), (2, 2), (0, 0), (0, 0)]


def test_lightweight_reaches_every_block_and_straddles_heads_where_asked():
    model = create_model("lw_swin_k4_fashion_mnist")
    attentions = [block.self_attn.attention for stage in model.stages for block in stage.blocks]
    assert len(attentions) == 6 and all(isinstance(a, GroupedMultiHeadAttention) for a in attentions)
    with pytest.raises(ConfigError, match=r"stage 1 \(width 32, heads=2\).*straddle_heads"):
        get_config("lw_swin_k4_fashion_mnist", **{"lightweight.straddle_heads": False})
    # where k divides the heads, straddling computes what whole heads compute
    whole = create_model("lw_swin_fashion_mnist", **TINY).eval()
    straddled = create_model("lw_swin_fashion_mnist", **TINY, **{"lightweight.straddle_heads": True}).eval()
    straddled.load_state_dict(whole.state_dict())
    images = torch.rand(2, 1, 12, 12)
    assert torch.equal(whole(images).logits, straddled(images).logits)


def test_table_ix_rows_are_printed_beside_the_paper():
    rows = _table_ix_rows()
    assert [row[3] for row in rows] == ["28.3M", "20.0M", "27.0M", "16.9M"]
    assert rows[0][1] == "28,288,354" and rows[3][2] == "16.97M"


def test_swin_configs_are_validated():
    with pytest.raises(ConfigError, match="divisible by patch_size x 2"):
        get_config("swin_fashion_mnist", padding=0)
    with pytest.raises(ConfigError, match="window=3 must divide stage 1"):
        get_config("swin_fashion_mnist", window=3)
    with pytest.raises(ConfigError, match="depths=.*heads="):
        get_config("swin_fashion_mnist", heads=[2, 4])


def test_a_saved_swin_loads_and_trains(tmp_path):
    model = create_model("lw_swin_fashion_mnist", drop_path=0.1, **TINY)
    save_pretrained(model.eval(), tmp_path)
    loaded = load_pretrained(tmp_path)
    images = torch.randint(0, 256, (2, 1, 12, 12), dtype=torch.uint8)
    assert torch.equal(model(images).logits, loaded(images).logits)
    loaded.train()
    out = loaded(images, labels=torch.tensor([1, 2]), output_hidden_states=True)
    out.loss.backward()
    assert all(p.grad is not None for p in loaded.parameters())
    assert len(out.hidden_states) == 1 + 4 and out.hidden_states[-1].shape == (2, 16, 16)
