"""tasks/region_tasks.py: what captioning and REC share, the region model a preset resolves to for the task's head
and data, and the word list a run saved."""
import json

import pytest

from interlayer.errors import ConfigError
from interlayer.tasks.captioning import CaptionData
from interlayer.tasks.rec import RECData
from interlayer.tasks.region_tasks import region_fields, region_model, saved_words

NEEDS = "captioning needs head=caption (e.g. caption_transformer_small)"


@pytest.mark.parametrize("data", [CaptionData(), RECData()], ids=["caption", "rec"])
def test_the_data_decides_the_region_models_width_count_length_and_vocabulary(data):
    fields = region_fields(data, 30)
    assert fields == {"feature_dim": 192, "max_regions": data.max_regions, "max_words": data.max_words,
                      "src_vocab_size": 30, "pad_id": 0}  # the generated scenes' regions are 192 wide
    data.dataset, data.feature_dim = "coco" if isinstance(data, CaptionData) else "refcoco", 64
    assert region_fields(data, 30)["feature_dim"] == 64


def test_a_preset_of_another_head_or_a_width_the_data_does_not_give_is_refused():
    fields = region_fields(CaptionData(), 30)
    config = region_model("caption_transformer_small", {"d_model": "32"}, fields, "caption", NEEDS)
    assert (config.head, config.feature_dim, config.transformer.src_vocab_size) == ("caption", 192, 30)
    with pytest.raises(ConfigError, match=r"preset 'rec_transformer_small' is a rec model; captioning needs "
                                          r"head=caption \(e\.g\. caption_transformer_small\)"):
        region_model("rec_transformer_small", {}, fields, "caption", NEEDS)
    with pytest.raises(ConfigError, match=r"feature_dim=7: the data's regions have 192 values \(data\.feature_dim\); "
                                          "drop the override"):
        region_model("caption_transformer_small", {"feature_dim": "7"}, fields, "caption", NEEDS)


def test_a_resumed_run_keeps_the_words_it_saved(tmp_path):
    assert saved_words(None) is None and saved_words(tmp_path) is None  # a new run builds its own
    (tmp_path / "task.json").write_text(json.dumps({"task": "caption", "words": ["<pad>", "a", "dog"]}))
    assert saved_words(tmp_path) == ["<pad>", "a", "dog"]
