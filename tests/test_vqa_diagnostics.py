"""benchmarks/vqa_diagnostics.py, whose figures docs/vqa.md reads: the reference rules' accuracies on the release,
the image-shuffle count and the spread of the image stack's states."""

import numpy as np
import pytest
import torch

from helpers.benchmarks import load_benchmark
from interlayer import create_model
from interlayer.data import sort_of_clevr as soc
from interlayer.tasks.vqa import VQATask
from interlayer.tasks.vqa_data import VQAData
from interlayer.training.config import TrainConfig

D = load_benchmark("vqa_diagnostics")


@pytest.mark.slow
def test_reference_rules_on_the_release():
    """docs/vqa.md's reference lines: 48.3% from the words alone, 64.5% with the image's number of squares."""
    train, test = soc.generate(10_000, 0, "train"), soc.generate(1_000, 0, "test")
    for key, expected in ((D.question_only, 48.3), (D.question_and_square_count, 64.5)):
        assert 100 * (D.rule_answers(train, test, key) == test.answers).mean() == pytest.approx(expected, abs=0.05)
    # the square-count rule answers "how many ... same shape as X" with the count of the likelier shape
    answers = D.rule_answers(train, test, D.question_and_square_count)
    for i in np.nonzero(np.array(test.kinds) == "count")[0][:50]:
        squares = int((test.shapes[test.image_index[i]] == 0).sum())
        assert soc.ANSWERS[answers[i]] in {str(squares), str(6 - squares)} or squares in (0, 6)


@pytest.fixture(scope="module")
def task_and_model():
    torch.manual_seed(0)
    task = VQATask(VQAData(image_features="objects", train_size=40, valid_size=40), TrainConfig())
    model = create_model("mcan_4layer", **{**task.model_fields(), "d_model": 16, "n_heads": 2, "d_ffn": 32,
                                          "word_dim": 8, "flat_mlp": 16, "fused_dim": 16, "layers": 2}).eval()
    return task, model


def test_region_spread_reads_the_projection_and_every_block(task_and_model):
    task, model = task_and_model
    split = task.valid_set
    spread = D.region_spread(model, split, batch_size=16)
    assert len(spread) == 3
    _, _, image, _ = split.inputs(range(len(split)))
    with torch.no_grad():
        projected = model.image_proj(image)
        expected = projected.std(dim=1).mean().item()
        hidden, padding = _question_memory(model, split)
        first = model.decoder.layers[0](projected, hidden, self_padding_mask=None, memory_padding_mask=padding)[0]
    first = first.std(dim=1).mean().item()
    assert spread[0] == pytest.approx(expected, rel=1e-5) and spread[1] == pytest.approx(first, rel=1e-4)


def _question_memory(model, split):
    question, padding, _, _ = split.inputs(range(len(split)))
    hidden = model.encoder(inputs_embeds=model.lstm(model.words(question)), key_padding_mask=padding).hidden
    return hidden, padding


def test_shuffled_images_change_nothing_for_a_blind_model(task_and_model):
    """A model answering from the words alone changes no answer; one answering from the image (the index of the
    region furthest right, 6 outcomes) changes most of them when each question gets another image."""
    task, _ = task_and_model

    def output(logits):
        return type("Output", (), {"logits": logits})

    class Blind(torch.nn.Module):
        def forward(self, question, padding, image, image_padding):
            return output(torch.nn.functional.one_hot(question[:, 2] % 10, 10).float())

    class Sighted(torch.nn.Module):
        def forward(self, question, padding, image, image_padding):
            return output(torch.nn.functional.one_hot(image[:, :, -2].argmax(1), 10).float())

    assert D.shuffled_change(Blind(), task.valid_set) == 0.0
    assert D.shuffled_change(Sighted(), task.valid_set) > 50.0
