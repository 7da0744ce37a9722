"""Image classification: IDX files, the bundled subset, the ViT and (PA-)Conv-Transformer image models, training.

Models run on 12 x 12 images (9 or 10 tokens) so every test stays tiny; the presets' 28 x 28 geometry is only
checked by construction.
"""
import gzip
import json

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.folders import saved_config
from interlayer import count_madds, count_parameters, create_model, get_config, load_pretrained, save_pretrained
from interlayer.checkpoint import tie_map
from interlayer.cli import main
from interlayer.config import ModelConfig
from interlayer.core.attention import MultiHeadAttention
from interlayer.core.config import ConfigError
from interlayer.data.idx import encode_idx, parse_idx, read_idx, read_labelled_images, write_idx
from interlayer.data.image_augment import crop_flip as augment
from interlayer.data.parallel import bundled_dir
from interlayer.data.text import DataError
from interlayer.experiment import train
from interlayer.methods.conv_branch import AttentionConvBlock
from interlayer.methods.lightweight import GroupedMultiHeadAttention
from interlayer.methods.multipass import MultiPassEncoder
from interlayer.methods.predictive import PredictiveMixer
from interlayer.models.vision import VISION_FIELDS, ConvMixer
from interlayer.tasks import task_specs
from interlayer.tasks.image import (
    FASHION_MNIST_CLASSES,
    FashionMNISTData,
    ImageTask,
    stratified_split,
    write_balanced_subset,
)
from interlayer.training.config import TrainConfig
from interlayer.training.engine import Trainer

SMALL = dict(image_height=12, image_width=12, d_model=32, d_ffn=64)  # ViT: 3x3 patches (+ CLS); conv: 12 -> 6 -> 3
CONV_SMALL = dict(SMALL, stage_widths=[4, 8])
TINY_TRAIN = ["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=2", "data.batch_size=4", "data.valid_fraction=0.25",
              "train.max_epochs=1", "train.warmup_steps=2", "train.log_interval=2"]


def _images(batch=2, size=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 1, size, size), dtype=torch.uint8, generator=generator)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine the second one only waits."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    """A learnable 12 x 12 data set in the publisher's layout: class c is a bright 3 x 3 square at cell c."""
    root = tmp_path_factory.mktemp("idx")
    rng = np.random.RandomState(0)
    for split, per_class in (("train", 4), ("t10k", 2)):
        labels = np.repeat(np.arange(10), per_class)
        rng.shuffle(labels)
        images = rng.randint(0, 60, (len(labels), 12, 12)).astype(np.uint8)
        for i, c in enumerate(labels):
            r, col = divmod(int(c), 4)
            images[i, 3 * r:3 * r + 3, 3 * col:3 * col + 3] = 250
        write_idx(root / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{split}-labels-idx1-ubyte", labels.astype(np.uint8))  # raw: both forms are read
    return root


# -- IDX files ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["uint8", "int8", ">i2", ">i4", ">f4", ">f8"])
def test_idx_round_trip_every_type_plain_and_gzip(tmp_path, dtype):
    array = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    for name in ("a.idx", "a.idx.gz"):
        write_idx(tmp_path / name, array)
        back = read_idx(tmp_path / name)
        assert back.shape == (2, 3, 4) and np.array_equal(back, array.astype(back.dtype))


def test_an_idx_header_with_huge_dimensions_is_reported_without_overflow():
    data = bytes([0, 0, 0x08, 3]) + (2 ** 21).to_bytes(4, "big") * 3 + b"x" * 10
    with pytest.raises(DataError, match=r"offset 26: data truncated; shape \(2097152, 2097152, 2097152\) of uint8 "
                                        r"needs 9223372036854775808 bytes .*corrupt header"):
        parse_idx(data, "huge.idx")


def test_idx_gzip_is_recognised_by_content_not_name(tmp_path):
    (tmp_path / "images.bin").write_bytes(gzip.compress(encode_idx(np.zeros((2, 2), np.uint8))))
    assert read_idx(tmp_path / "images.bin").shape == (2, 2)


@pytest.mark.parametrize("data, message", [
    (b"\x00", r"f\.idx: 1 bytes, too short"),
    (b"\x08\x03\x00\x00", r"f\.idx: offset 0: IDX files start with two zero bytes"),
    (b"\x00\x00\x0a\x01\x00\x00\x00\x01\x07", r"offset 2: unknown IDX type code 0x0a"),
    (b"\x00\x00\x08\x00", r"offset 3: the header declares 0 dimensions"),
    (b"\x00\x00\x08\x02\x00\x00\x00\x02\x00\x00", r"offset 10: header truncated; 2 dimensions need 12"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", r"offset 10: data truncated; .* needs 5 bytes .* \(3 missing\)"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x01\x01\x02", r"offset 9: 1 unexpected trailing bytes"),
])
def test_malformed_idx_names_file_and_offset(tmp_path, data, message):
    (tmp_path / "f.idx").write_bytes(data)
    with pytest.raises(DataError, match=message):
        read_idx(tmp_path / "f.idx")


def test_truncated_and_corrupt_gzip_name_the_file(tmp_path):
    packed = gzip.compress(encode_idx(np.arange(5000, dtype=np.uint8).reshape(50, 100) % 7))
    (tmp_path / "cut.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DataError, match=r"cut\.gz: compressed offset \d+: the gzip stream ends early"):
        read_idx(tmp_path / "cut.gz")
    (tmp_path / "bad.gz").write_bytes(packed[:12] + bytes(40) + packed[52:])
    with pytest.raises(DataError, match=r"bad\.gz: corrupt gzip data"):
        read_idx(tmp_path / "bad.gz")


def test_image_and_label_files_must_pair(tmp_path):
    write_idx(tmp_path / "x", np.zeros((3, 2, 2), np.uint8))
    write_idx(tmp_path / "y", np.zeros(2, np.uint8))
    with pytest.raises(DataError, match=r"holds 3 images but .*y holds 2 labels"):
        read_labelled_images(tmp_path / "x", tmp_path / "y")
    write_idx(tmp_path / "y2", np.zeros((3, 1), np.uint8))
    with pytest.raises(DataError, match=r"y2: expected one integer label per image"):
        read_labelled_images(tmp_path / "x", tmp_path / "y2")
    write_idx(tmp_path / "xf", np.zeros((3, 2, 2), ">f4"))
    with pytest.raises(DataError, match=r"xf: expected unsigned-byte images"):
        read_labelled_images(tmp_path / "xf", tmp_path / "y")


def test_out_of_range_label_and_missing_file_are_data_errors(idx_dir, tmp_path):
    with pytest.raises(DataError, match=r"labels-idx1-ubyte: example \d+ has label [5-9], but there are 5 classes"):
        ImageTask(FashionMNISTData(dir=str(idx_dir), class_names=list("abcde")), TrainConfig())
    with pytest.raises(DataError, match=r"no such file \(nor train-images-idx3-ubyte\.gz\); set data\.dir"):
        ImageTask(FashionMNISTData(dir=str(tmp_path), format="idx"), TrainConfig())
    with pytest.raises(DataError, match=r"cannot tell the format: no IDX training file .* set data\.format"):
        ImageTask(FashionMNISTData(dir=str(tmp_path)), TrainConfig())


# -- bundled subset, splits, augmentation -----------------------------------------------------------------------
def test_bundled_subset_is_class_balanced_with_source_and_licence():
    root = bundled_dir("fashion-mnist")
    for split, per_class in (("train", 300), ("t10k", 100)):
        labels = read_idx(root / f"{split}-labels-idx1-ubyte.gz")
        assert np.array_equal(np.bincount(labels), [per_class] * 10)
    assert read_idx(root / "t10k-images-idx3-ubyte.gz").shape == (1000, 28, 28)
    source = (root / "SOURCE.md").read_text()
    assert "RandomState(0)" in source and "MIT" in source and (root / "SOURCE-COPYRIGHT").is_file()


def test_subset_writer_is_balanced_ordered_and_reproducible(idx_dir, tmp_path):
    source = FashionMNISTData(dir=str(idx_dir), test_images="t10k-images-idx3-ubyte")
    for out in ("a", "b"):
        write_balanced_subset(source, tmp_path / out, train_per_class=2, test_per_class=1, seed=3)
    labels = read_idx(tmp_path / "a" / "train-labels-idx1-ubyte.gz")
    assert np.array_equal(np.bincount(labels), [2] * 10)
    full_images, full_labels = read_labelled_images(idx_dir / "train-images-idx3-ubyte.gz",
                                                    idx_dir / "train-labels-idx1-ubyte")
    images = read_idx(tmp_path / "a" / "train-images-idx3-ubyte.gz")
    rows = [next(i for i in range(len(full_images)) if np.array_equal(full_images[i, 0], im)) for im in images]
    assert rows == sorted(rows) and np.array_equal(full_labels[rows], labels)
    for name in ("train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_validation_split_is_class_balanced_disjoint_and_fixed():
    labels = torch.arange(10).repeat_interleave(20)
    train_a, valid_a = stratified_split(labels, 0.1, seed=0)
    train_b, valid_b = stratified_split(labels, 0.1, seed=0)
    assert torch.equal(valid_a, valid_b) and torch.equal(train_a, train_b)
    assert torch.equal(torch.bincount(labels[valid_a]), torch.full((10,), 2))
    assert set(train_a.tolist()).isdisjoint(valid_a.tolist()) and len(train_a) + len(valid_a) == 200
    assert not torch.equal(stratified_split(labels, 0.1, seed=1)[1], valid_a)


def test_task_normalises_with_training_split_statistics(idx_dir):
    task = ImageTask(FashionMNISTData(dir=str(idx_dir), valid_fraction=0.25), TrainConfig())
    pixels = task.train_images.double() / 255
    assert task.pixel_mean == pytest.approx([float(pixels.mean())])
    assert task.pixel_std == pytest.approx([float(pixels.std())])
    assert len(task.valid_labels) == 10 and len(task.train_labels) == 30
    fields = task.model_fields()
    assert (fields["image_height"], fields["channels"], fields["num_classes"]) == (12, 1, 10)


def test_batches_depend_only_on_seed_and_epoch_and_cover_the_split(idx_dir):
    task = ImageTask(FashionMNISTData(dir=str(idx_dir), valid_fraction=0.25, batch_size=4), TrainConfig())
    first = task.train_batches(1, 7)
    assert [b.index.tolist() for b in first] == [b.index.tolist() for b in task.train_batches(1, 7)]
    assert [b.seed for b in first] == [b.seed for b in task.train_batches(1, 7)]
    assert sorted(torch.cat([b.index for b in first]).tolist()) == list(range(30))
    assert [b.index.tolist() for b in task.train_batches(2, 7)] != [b.index.tolist() for b in first]


def test_sample_input_feeds_attention_pictures(idx_dir):
    task = ImageTask(FashionMNISTData(dir=str(idx_dir), valid_fraction=0.25), TrainConfig())
    args, kwargs, labels = task_specs()["fashion_mnist"].sample_input(task)
    model = create_model(get_config("pa_vit_fashion_mnist", **task.model_fields()), d_model=32)
    attentions = model.eval()(*args, **kwargs, need_intermediates=True).encoder.attentions
    assert args[0].shape == (1, 1, 12, 12) and labels == [] and "predicted" in attentions[1].extras


@pytest.mark.parametrize("mode", ["flip", "crop", "crop_flip"])
def test_augmentations_change_images_reproducibly(mode):
    images = _images(4)
    out = augment(images, mode, 2, torch.Generator().manual_seed(1))
    assert out.shape == images.shape and out.dtype == torch.uint8 and not torch.equal(out, images)
    assert torch.equal(out, augment(images, mode, 2, torch.Generator().manual_seed(1)))
    if mode == "flip":
        assert all(torch.equal(o, i) or torch.equal(o, i.flip(-1)) for o, i in zip(out, images))
    if mode == "crop":  # every output is a window of the zero-padded image
        padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
        assert all(any(torch.equal(o, p[:, dy:dy + 12, dx:dx + 12]) for dy in range(5) for dx in range(5))
                   for o, p in zip(out, padded))


def test_augment_setting_reaches_the_training_batches(idx_dir):
    plain = ImageTask(FashionMNISTData(dir=str(idx_dir), valid_fraction=0.25, batch_size=4), TrainConfig())
    flipped = ImageTask(FashionMNISTData(dir=str(idx_dir), valid_fraction=0.25, batch_size=4, augment="flip"),
                        TrainConfig())
    batch = plain.train_batches(1, 1)[0]
    assert torch.equal(plain.batch_images(batch)[0], plain.train_images[batch.index])
    assert not torch.equal(flipped.batch_images(batch)[0], plain.batch_images(batch)[0])


def test_evaluate_refuses_images_of_another_size_and_empty_validation(idx_dir, tmp_path, capsys):
    model = create_model("vit_fashion_mnist", **SMALL)
    save_pretrained(model, tmp_path / "m")
    ImageTask(FashionMNISTData(dir=str(idx_dir), valid_fraction=0.25), TrainConfig()).save_assets(tmp_path / "m")
    write_idx(tmp_path / "x-images-idx3-ubyte", np.zeros((2, 8, 8), np.uint8))
    write_idx(tmp_path / "x-labels-idx1-ubyte", np.zeros(2, np.uint8))
    assert main(["evaluate", "--checkpoint", str(tmp_path / "m"), "--data",
                 str(tmp_path / "x-images-idx3-ubyte")]) == 2
    assert "images of shape (1, 8, 8) (channels, height, width), but the model reads (1, 12, 12)" in \
        capsys.readouterr().err
    with pytest.raises(DataError, match=r"valid_fraction=0.01 of 40 examples leaves 40 for training and 0"):
        ImageTask(FashionMNISTData(dir=str(idx_dir), valid_fraction=0.01), TrainConfig())


def test_data_settings_are_validated():
    for key, value, message in (("valid_fraction", 0.0, "data.valid_fraction=0.0"),
                                ("batch_size", 0, "data.batch_size=0"), ("augment", "rotate", "data.augment"),
                                ("crop_padding", -1, "data.crop_padding=-1")):
        with pytest.raises(ConfigError, match=message):
            FashionMNISTData(**{key: value}).validate()


# -- models ------------------------------------------------------------------------------------------------------
def test_vision_and_encoder_fields_are_disjoint_so_flat_overrides_route():
    assert not set(VISION_FIELDS) & {f for f in ModelConfig.__dataclass_fields__}
    cfg = get_config("vit_fashion_mnist", patch_size=3, d_model=32, encoder__n_heads=2, image_height=12,
                            image_width=12)
    assert (cfg.patch_size, cfg.encoder.d_model, cfg.encoder.n_heads) == (3, 32, 2)
    assert (cfg.encoder.grid_height, cfg.encoder.grid_width, cfg.encoder.max_positions) == (4, 4, 17)


def test_vit_forward_backward_reaches_every_parameter():
    model = create_model("vit_fashion_mnist", **SMALL)
    out = model(_images(3))
    assert out.logits.shape == (3, 10) and model.config.tokens == 10
    out.logits.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert model.classifier.encoder.embed.positions.weight.shape == (10, 32)  # learned: CLS + 3 x 3 patches


def test_mean_pooling_drops_the_cls_token():
    model = create_model("vit_fashion_mnist", pooling="mean", **SMALL)
    assert model.embed.cls_token is None and model.config.tokens == 9
    assert model(_images()).encoder.hidden.shape == (2, 9, 32)


def test_vit_with_2d_relative_positions_and_cls_prefix():
    model = create_model("vit_fashion_mnist", positions="relative_2d", **SMALL)
    out = model(_images(), need_intermediates=True)
    relative = model.encoder.layers[0].self_attn.relative
    assert (relative.height, relative.width) == (3, 3) and model.encoder.embed.positions is None
    bias = relative(out.encoder.attentions[0].q, 0, 10)
    assert torch.all(bias[:, :, 0] == 0) and torch.all(bias[:, :, :, 0] == 0) and bias[:, :, 1:, 1:].abs().sum() > 0


def test_pixel_normalisation_uses_the_config_and_accepts_uint8_or_float():
    images = _images()
    model = create_model("vit_fashion_mnist", **SMALL).eval()
    shifted = create_model("vit_fashion_mnist", pixel_mean=[0.5], pixel_std=[0.25], **SMALL).eval()
    shifted.load_state_dict(model.state_dict())
    assert torch.allclose(model(images).logits, model(images.float() / 255).logits, atol=1e-6)
    assert not torch.allclose(model(images).logits, shifted(images).logits)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 12, 12\)"):
        model(_images(size=14))
    colour = create_model("vit_fashion_mnist", channels=3, pixel_mean=[0.1, 0.2, 0.3], pixel_std=[1, 1, 1],
                                 **SMALL)
    assert colour.embed.proj.in_channels == 3 and colour(torch.rand(2, 3, 12, 12)).logits.shape == (2, 10)


def test_conv_transformer_stages_widths_and_forward_backward():
    model = create_model("pa_conv_transformer_fashion_mnist", **CONV_SMALL)
    assert [len(stage.blocks) for stage in model.embed.stages] == [1, 1]
    assert [stage.transition.out_channels for stage in model.embed.stages] == [8, 32]
    assert model.embed.stem.out_channels == 4 and model.config.grid == (3, 3)
    layers = model.encoder.layers
    assert all(isinstance(layer.self_attn, AttentionConvBlock) for layer in layers)
    assert layers[0].self_attn.wants_prev_logits is False
    assert all(isinstance(layer.self_attn.attention.logit_mixer, PredictiveMixer) for layer in layers[1:])
    assert layers[1].self_attn.attention.logit_mixer.alpha == 0.01
    out = model(_images(2))
    out.logits.sum().backward()
    assert out.logits.shape == (2, 10)
    assert all(p.grad is not None for p in model.parameters())


def test_stage_blocks_and_conv_kernel_shape_the_cnn_stages():
    model = create_model("conv_transformer_fashion_mnist", stage_blocks=2, conv_kernel=5, **CONV_SMALL)
    assert [len(stage.blocks) for stage in model.embed.stages] == [2, 2]
    assert model.embed.stem.kernel_size == (5, 5)
    assert model.embed.stages[0].blocks[1].self_attn.conv.conv.kernel_size == (5, 5)
    assert model(_images()).logits.shape == (2, 10)


def test_cnn_baseline_has_no_attention_and_refuses_attention_sections():
    model = create_model("cnn_fashion_mnist", **CONV_SMALL)
    assert not any(isinstance(m, MultiHeadAttention) for m in model.modules())
    assert all(isinstance(layer.self_attn, ConvMixer) for layer in model.encoder.layers)
    assert model(_images()).logits.shape == (2, 10)
    with pytest.raises(ConfigError, match=r"attention=False builds the CNN baseline .* sections predictive"):
        create_model("cnn_fashion_mnist", predictive={}, **CONV_SMALL)


def test_table3_parameter_and_madds_ordering_at_28x28():
    """PA Table 3: the Conv-Transformer is smaller and cheaper than the CNN; PA adds few parameters."""
    cnn, conv, pa = (create_model(n) for n in ("cnn_fashion_mnist", "conv_transformer_fashion_mnist",
                                                      "pa_conv_transformer_fashion_mnist"))
    assert count_parameters(conv) < count_parameters(cnn)
    assert count_parameters(pa) - count_parameters(conv) == 2 * (4 * 4 * 9 + 4)  # two 3x3 4->4 mixers
    assert count_madds(conv, 49) < count_madds(cnn, 49) < count_madds(pa, 49) * 1.1


def test_lw_presets_follow_table_ix_ratios():
    base = count_parameters(create_model("vit_fashion_mnist"))
    k2 = count_parameters(create_model("lw_vit_fashion_mnist"))
    k4 = count_parameters(create_model("lw_vit_k4_fashion_mnist"))
    large = count_parameters(create_model("lw_large_vit_fashion_mnist"))
    assert 0.65 < k2 / base < 0.75 and k4 < k2 and 0.95 < large / base < 1.1  # Table IX: 70.7%, 59.7%, 95.4%


@pytest.mark.parametrize("preset, overrides", [
    ("vit_fashion_mnist", dict(SMALL)),
    ("vit_fashion_mnist", dict(SMALL, positions="relative_2d")),
    ("pa_vit_fashion_mnist", dict(SMALL)),
    ("lw_vit_fashion_mnist", dict(SMALL)),
    ("cnn_fashion_mnist", dict(CONV_SMALL)),
    ("pa_conv_transformer_fashion_mnist", dict(CONV_SMALL)),
])
def test_madds_match_the_flop_counter(preset, overrides):
    model = create_model(preset, attn_impl="eager", **overrides).eval()
    with FlopCounterMode(display=False) as counter:
        model(_images(2))
    assert counter.get_total_flops() == 2 * 2 * count_madds(model, model.config.tokens)
    with pytest.raises(ValueError, match="always reads"):
        model.madds(model.config.tokens + 1)


def test_method_sections_apply_to_the_image_encoder():
    lw = create_model("vit_fashion_mnist", lightweight={"groups": 2}, **SMALL)
    assert all(isinstance(layer.self_attn, GroupedMultiHeadAttention) for layer in lw.encoder.layers)
    pa = create_model("vit_fashion_mnist", **{"predictive.alpha": 0.5}, **SMALL)
    assert pa.encoder.layers[1].self_attn.logit_mixer.alpha == 0.5
    mpt = create_model("vit_fashion_mnist", multipass={"passes": 2, "loss": "all"}, **SMALL)
    assert isinstance(mpt.encoder, MultiPassEncoder)
    assert len(mpt.train()(_images()).exit_logits) == 2
    cross = create_model("vit_fashion_mnist", crossformer={"hard": ["kq"]}, **SMALL)
    layers = cross.encoder.layers
    assert layers[0].self_attn.k_proj.weight is layers[1].self_attn.q_proj.weight and tie_map(cross)
    sg = create_model("vit_fashion_mnist", crossformer={"soft": ["kq"]}, **SMALL)
    assert float(sg(_images()).aux_losses["crossformer_sg"].detach()) > 0


def test_override_and_validation_errors_name_the_key():
    cases = [
        (dict(patch_size=5), r"patch_size=5 must divide the image size 28x28; valid: \[1, 2, 4, 7, 14, 28\]"),
        (dict(grid_height=3), r"grid_height is derived from the image size"),
        (dict(pach_size=4), r"unknown key 'pach_size' \(did you mean 'patch_size'\?\)"),
        (dict(pixel_mean=[0.1, 0.2]), r"pixel_mean=\[0.1, 0.2\] needs one value per channel"),
        (dict(backbone="resnet"), r"backbone='resnet' is not valid"),
        (dict(arch="encoder_decoder"), r"arch='encoder_decoder': an image model classifies"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            get_config("vit_fashion_mnist", **overrides)
    with pytest.raises(ConfigError, match=r"pooling='mean', got pooling='cls'"):
        get_config("conv_transformer_fashion_mnist", pooling="cls")
    with pytest.raises(ConfigError, match=r"stage_widths=\[4, 4, 4\] halves the image 3 times"):
        get_config("conv_transformer_fashion_mnist", stage_widths=[4, 4, 4])
    with pytest.raises(ConfigError, match=r"unknown preset 'vit_fashion'"):
        get_config("vit_fashion")


def test_save_and_load_pretrained_rebuild_both_backbones(tmp_path):
    for preset, overrides in (("vit_fashion_mnist", dict(SMALL, crossformer={"hard": ["kq"]})),
                              ("pa_conv_transformer_fashion_mnist", CONV_SMALL)):
        model = create_model(preset, **overrides).eval()
        save_pretrained(model, tmp_path / preset)
        loaded = load_pretrained(tmp_path / preset).eval()
        assert type(loaded) is type(model) and loaded.model_type == model.config.backbone
        assert loaded.config == model.config and tie_map(loaded) == tie_map(model)
        images = _images()
        assert torch.equal(loaded(images).logits, model(images).logits)
    saved = saved_config(tmp_path / "vit_fashion_mnist")
    assert saved["backbone"] == "vit" and saved["encoder"]["crossformer"]["hard"] == ["kq"]


# -- training and the command line -------------------------------------------------------------------------------
def _sets(pairs):
    return dict(pair.split("=", 1) for pair in pairs)


def test_experiment_train_smoke(idx_dir, tmp_path):
    spec = task_specs()["fashion_mnist"]
    results = train(spec, sets=_sets(TINY_TRAIN + [f"data.dir={idx_dir}"]), run_dir=tmp_path / "run", progress=False)
    assert results["status"] == "finished" and results["epochs"] == 1 and results["steps"] == 8
    assert 0.0 <= results["test_accuracy"] <= 100.0 and set(results["test_per_class"]) == set(FASHION_MNIST_CLASSES)
    assert results["parameters"] > 0 and results["madds_per_image"] > 0
    assert (tmp_path / "run" / "test_report.txt").is_file() and (tmp_path / "run" / "best" / "config.json").is_file()
    stored = json.loads((tmp_path / "run" / "run.json").read_text())
    assert stored["model"]["backbone"] == "vit" and stored["model"]["encoder"]["d_model"] == 16
    task = ImageTask(FashionMNISTData(dir=str(idx_dir), valid_fraction=0.25), TrainConfig())
    assert stored["model"]["pixel_mean"] == pytest.approx(task.pixel_mean)


def test_interrupted_and_resumed_run_with_augmentation_reaches_the_same_weights(idx_dir, tmp_path):
    cfg = TrainConfig(**{**task_specs()["fashion_mnist"].train_defaults, "max_epochs": 2, "warmup_steps": 2})
    task = ImageTask(FashionMNISTData(dir=str(idx_dir), valid_fraction=0.25, batch_size=4, augment="crop_flip"), cfg)

    def tiny():
        return create_model(get_config("vit_fashion_mnist", **task.model_fields()), d_model=16,
                                   n_heads=2, d_ffn=32, enc_layers=2, dropout=0.1)

    torch.manual_seed(0)
    uninterrupted = tiny()
    Trainer(task, uninterrupted, cfg, tmp_path / "a", progress=False).fit()
    torch.manual_seed(0)
    model = tiny()
    trainer = Trainer(task, model, cfg, tmp_path / "b", progress=False)
    inner = task.loss

    def stopping_loss(m, batch):
        if trainer.state.step == 8 + 3:  # mid-way through the second epoch of 8 batches
            trainer.request_stop()
        return inner(m, batch)

    task.loss = stopping_loss
    assert not trainer.fit().finished
    task.loss = inner
    torch.manual_seed(123)
    resumed = tiny()
    assert Trainer(task, resumed, cfg, tmp_path / "b", resume=True, progress=False).fit().step == 16
    a, b = uninterrupted.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cli_train_then_evaluate_prints_accuracy_per_class_and_confusion(idx_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["train", "fashion_mnist", "--data-dir", str(idx_dir), "--run-dir", str(run_dir), "--no-progress"]
    for pair in TINY_TRAIN + ["predictive.alpha=0.1"]:
        args += ["--set", pair]
    assert main(args) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["task"] == "fashion_mnist" and "test_accuracy" in results
    assert json.loads((run_dir / "best" / "task.json").read_text())["task"] == "fashion_mnist"
    assert main(["evaluate", "--checkpoint", str(run_dir / "best")]) == 0
    report = capsys.readouterr().out
    assert "accuracy" in report and "(" in report and "/20)" in report
    assert "| Ankle boot" in report and "precision %" in report and "confusion matrix" in report
    assert main(["evaluate", "--checkpoint", str(run_dir / "best"), "--data",
                 str(idx_dir / "train-images-idx3-ubyte.gz")]) == 0
    assert "/40)" in capsys.readouterr().out
    assert main(["evaluate", "--checkpoint", str(run_dir / "best"), "--data", str(idx_dir)]) == 0
    assert "/20)" in capsys.readouterr().out
    assert main(["evaluate", "--checkpoint", str(run_dir / "best"), "--data", str(idx_dir / "nope.gz")]) == 2
    assert "cannot tell where its labels are" in capsys.readouterr().err


def test_cli_reports_config_and_data_errors(idx_dir, tmp_path, capsys):
    base = ["train", "fashion_mnist", "--data-dir", str(idx_dir), "--no-progress", "--set", "data.valid_fraction=0.25"]
    assert main(base + ["--run-dir", str(tmp_path / "a"), "--set", "patch_size=5"]) == 2
    assert "patch_size=5 must divide the image size 12x12" in capsys.readouterr().err
    assert main(base + ["--run-dir", str(tmp_path / "b"), "--set", "data.augment=rotate"]) == 2
    assert "data.augment='rotate' is not valid" in capsys.readouterr().err
