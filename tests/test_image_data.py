"""The image task's other formats (CIFAR binary, .npz, ImageFolder), Swin's augmentations, and the `image` task
training the new backbones (data/image_formats.py, data/image_augment.py, tasks/image.py)."""
import json
import os

import numpy as np
import pytest
import torch

from interlayer.cli import main
from interlayer.core.config import ConfigError
from interlayer.data.image_augment import RAND_OPS, mix, rand_augment, random_erasing, random_resized_crop
from interlayer.data.image_formats import detect_format, read_cifar, read_folder
from interlayer.data.text import DataError
from interlayer.tasks.image import ImageData, ImageTask, image_family
from interlayer.training.config import TrainConfig

Image = pytest.importorskip("PIL.Image", reason="ImageFolder reading needs Pillow (the image extra)")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine the second one only waits."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _images(n, channels=3, size=32, seed=0):
    return np.random.RandomState(seed).randint(0, 256, (n, channels, size, size)).astype(np.uint8)


def _cifar_records(images, *labels):
    return b"".join(bytes(label[i] for label in labels) + images[i].tobytes() for i in range(len(images)))


@pytest.fixture
def cifar10(tmp_path):
    root = tmp_path / "cifar-10-batches-bin"
    root.mkdir()
    for i in range(1, 6):
        (root / f"data_batch_{i}.bin").write_bytes(_cifar_records(_images(4, seed=i), [i % 3, 0, 1, 2]))
    (root / "test_batch.bin").write_bytes(_cifar_records(_images(3, seed=9), [0, 1, 2]))
    (root / "batches.meta.txt").write_text("airplane\nautomobile\nbird\n\n")
    return root


def test_cifar10_binary_is_read_channel_major_with_its_names(cifar10):
    images, labels = read_cifar(cifar10, "train")
    assert images.shape == (20, 3, 32, 32) and labels.tolist()[:4] == [1, 0, 1, 2]
    assert np.array_equal(images[0], _images(4, seed=1)[0])  # 1,024 red bytes, then green, then blue
    task = ImageTask(ImageData(dir=str(cifar10), valid_fraction=0.25, batch_size=4), TrainConfig())
    assert task.class_names == ["airplane", "automobile", "bird"] and task.model_fields()["channels"] == 3
    (cifar10 / "data_batch_3.bin").write_bytes(b"\x00" * 3000)
    with pytest.raises(DataError, match=r"data_batch_3\.bin: 3000 bytes is not a whole number of 3073-byte"):
        read_cifar(cifar10, "train")


def test_cifar100_binary_reads_fine_or_coarse_labels(tmp_path):
    images = _images(4)
    (tmp_path / "train.bin").write_bytes(_cifar_records(images, [7, 7, 8, 9], [70, 71, 80, 99]))
    (tmp_path / "test.bin").write_bytes(_cifar_records(images[:2], [7, 8], [70, 80]))
    (tmp_path / "fine_label_names.txt").write_text("\n".join(f"f{i}" for i in range(100)))
    assert read_cifar(tmp_path, "train")[1].tolist() == [70, 71, 80, 99]
    assert read_cifar(tmp_path, "train", "coarse")[1].tolist() == [7, 7, 8, 9]
    assert detect_format(tmp_path, "train-images-idx3-ubyte") == "cifar"
    data = ImageData(dir=str(tmp_path), valid_fraction=0.5)
    assert data.names(torch.tensor([0]))[99] == "f99"
    with pytest.raises(DataError, match="coarse_label_names.txt|at least 2|example"):
        ImageTask(ImageData(dir=str(tmp_path), valid_fraction=0.5, cifar_labels="coarse",
                            class_names=["a", "b"]), TrainConfig())


def test_npz_in_either_channel_order_and_no_pickles(tmp_path):
    train = _images(6, channels=3, size=8).transpose(0, 2, 3, 1)  # NHWC, Keras's order
    np.savez(tmp_path / "set.npz", x_train=train, y_train=np.array([0, 1, 0, 1, 0, 1]),
             x_test=train[:2], y_test=np.array([1, 0]), class_names=np.array(["cat", "dog"]))
    task = ImageTask(ImageData(dir=str(tmp_path / "set.npz"), valid_fraction=0.5), TrainConfig())
    assert task.class_names == ["cat", "dog"] and task.train_images.shape[1:] == (3, 8, 8)
    np.savez(tmp_path / "bad.npz", x_train=np.array([object()], dtype=object), y_train=np.array([0]),
             x_test=np.zeros((1, 2, 2), np.uint8), y_test=np.array([0]))
    with pytest.raises(DataError, match=r"bad\.npz: cannot read it as a numpy \.npz without pickles"):
        ImageTask(ImageData(dir=str(tmp_path / "bad.npz")), TrainConfig())
    np.savez(tmp_path / "float.npz", x_train=np.zeros((2, 4, 4)), y_train=np.array([0, 1]),
             x_test=np.zeros((1, 4, 4)), y_test=np.array([0]))
    with pytest.raises(DataError, match=r"float\.npz\[x_train\]: expected uint8 images"):
        ImageTask(ImageData(dir=str(tmp_path / "float.npz")), TrainConfig())


def _folder(root, sizes, modes=("L", "L")):
    for split in ("train", "test"):
        for c, (name, mode) in enumerate(zip(("apple", "pear"), modes)):
            (root / split / name).mkdir(parents=True)
            for i, size in enumerate(sizes):
                Image.fromarray(_images(1, 1, size, seed=c * 10 + i)[0, 0]).convert(mode).save(
                    root / split / name / f"{i}.png")


def test_image_folder_classes_colour_and_sizes(tmp_path):
    _folder(tmp_path / "a", [6, 6, 6])
    task = ImageTask(ImageData(dir=str(tmp_path / "a"), valid_fraction=0.34), TrainConfig())
    assert task.class_names == ["apple", "pear"] and task.train_images.shape[1:] == (1, 6, 6)
    _folder(tmp_path / "b", [6, 6], modes=("L", "RGB"))
    images, labels = read_folder(tmp_path / "b", "train", ["apple", "pear"])
    assert images.shape == (4, 3, 6, 6) and labels.tolist() == [0, 0, 1, 1]
    assert np.array_equal(images[0, 0], images[0, 2])  # a grey image repeated to RGB
    _folder(tmp_path / "c", [6, 7])
    with pytest.raises(DataError, match=r"1\.png: 7x7 pixels, but .*0\.png has 6x6; set data\.image_size"):
        read_folder(tmp_path / "c", "train", ["apple", "pear"])
    assert read_folder(tmp_path / "c", "train", ["apple", "pear"], size=[5, 4])[0].shape == (4, 1, 5, 4)


def test_image_folder_refuses_links_out_and_unknown_classes(tmp_path):
    _folder(tmp_path / "d", [4, 4])
    outside = tmp_path / "outside.png"
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(outside)
    os.symlink(outside, tmp_path / "d" / "train" / "apple" / "link.png")
    with pytest.raises(DataError, match="leads outside"):
        read_folder(tmp_path / "d", "train", ["apple", "pear"])
    (tmp_path / "d" / "test" / "plum").mkdir()
    with pytest.raises(DataError, match=r"class folder\(s\) \['plum'\] are not among"):
        read_folder(tmp_path / "d", "test", ["apple", "pear"])


# -- augmentations ----------------------------------------------------------------------------------------------
def test_rand_augment_ops_keep_shape_range_and_reproduce():
    generator = torch.Generator().manual_seed(0)
    image = torch.from_numpy(_images(1, 3, 10)[0]).float()
    for name, op in RAND_OPS.items():
        out = op(image, 0.9, generator)
        assert out.shape == image.shape and 0 <= out.min() and out.max() <= 255, name
    batch = torch.from_numpy(_images(6, 1, 12))
    a = rand_augment(batch, torch.Generator().manual_seed(3))
    assert a.dtype == torch.uint8 and torch.equal(a, rand_augment(batch, torch.Generator().manual_seed(3)))
    assert not torch.equal(a, batch)
    assert torch.equal(rand_augment(batch, torch.Generator().manual_seed(3), ops=0), batch)


def test_resized_crop_erasing_and_mixes():
    batch = torch.from_numpy(_images(4, 1, 12))
    whole = random_resized_crop(batch, torch.Generator().manual_seed(0), scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert torch.equal(whole, batch)
    assert not torch.equal(random_resized_crop(batch, torch.Generator().manual_seed(0)), batch)
    assert torch.equal(random_erasing(batch, torch.Generator(), 0.0), batch)
    erased = random_erasing(batch, torch.Generator().manual_seed(1), 1.0)
    assert all(not torch.equal(e, b) for e, b in zip(erased, batch))
    labels = torch.tensor([0, 1, 2, 3])
    mixed, (paired, lam) = mix(batch, labels, seed=5, mixup=0.8, cutmix=0.0)
    assert paired.tolist() == [3, 2, 1, 0] and 0 < float(lam) < 1
    expected = (lam * batch.float() + (1 - lam) * batch.flip(0).float()).round()
    assert torch.equal(mixed.float(), expected.float())
    cut, (_, lam) = mix(batch, labels, seed=5, mixup=0.0, cutmix=1.0)
    pasted = (cut != batch).any(1).float().mean(dim=(1, 2))  # the pasted box's share (where pixels differ)
    assert float(pasted.max()) <= 1 - float(lam) + 1e-6
    assert mix(batch, labels, seed=5, mixup=0.0, cutmix=0.0)[1] is None


def test_mixed_batches_reach_the_loss(cifar10):
    data = ImageData(dir=str(cifar10), valid_fraction=0.25, batch_size=4, mixup=0.8, randaugment=2,
                     erasing=0.5, resized_crop=True, augment="flip")
    task = ImageTask(data, TrainConfig(label_smoothing=0.0))
    images, labels, (paired, lam) = task.prepare(task.train_batches(0, 0)[0])
    logits = torch.randn(4, 3)

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return type("Out", (), {"logits": logits, "exit_logits": None, "aux_losses": {}})()
    loss, logs, count = task.loss(Fixed(), (images, labels, (paired, lam)))
    ce = torch.nn.functional.cross_entropy
    assert torch.allclose(loss, lam * ce(logits, labels) + (1 - lam) * ce(logits, paired))


def test_augmentation_settings_are_validated():
    for key, value, message in (("randaugment", -1, "data.randaugment=-1"), ("erasing", 1.5, "data.erasing=1.5"),
                                ("image_size", [3], r"data.image_size=\[3\]"), ("mixup", -0.1, "data.mixup=-0.1")):
        with pytest.raises(ConfigError, match=message):
            ImageData(**{key: value}).validate()


# -- the image task with the new backbones -----------------------------------------------------------------------
def test_the_image_task_takes_every_image_family_and_refuses_others():
    assert [image_family(n) for n in ("vit_fashion_mnist", "lw_swin_fashion_mnist", "pa_aa_resnet50")] == [
        "image", "swin", "aa_resnet"]
    with pytest.raises(ConfigError, match=r"'transformer_small' is not an image model; image presets: .*swin_t"):
        image_family("transformer_small")


@pytest.mark.parametrize("preset, sets", [
    ("lw_swin_fashion_mnist", ["padding=0", "embed_dim=8", "depths=[2,2]", "heads=[2,2]", "patch_size=2"]),
    ("pa_aa_resnet_fashion_mnist", ["widths=[4,8,8]", "stem_width=4", "heads=2"]),
])
def test_cli_trains_and_evaluates_the_new_backbones(cifar10, tmp_path, capsys, preset, sets):
    run_dir = tmp_path / "run"
    args = ["train", "image", "--preset", preset, "--data-dir", str(cifar10), "--run-dir", str(run_dir),
            "--no-progress"]
    for pair in sets + ["data.batch_size=4", "data.valid_fraction=0.25", "train.max_epochs=1",
                        "train.warmup_steps=2", "data.randaugment=1", "data.cutmix=1.0"]:
        args += ["--set", pair]
    assert main(args) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["task"] == "image" and "test_accuracy" in results and results["madds_per_image"] > 0
    assert json.loads((run_dir / "best" / "task.json").read_text())["class_names"][0] == "airplane"
    assert main(["evaluate", "--checkpoint", str(run_dir / "best")]) == 0
    assert "/3)" in capsys.readouterr().out and "| airplane" not in ""
