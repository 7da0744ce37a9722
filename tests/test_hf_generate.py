"""``generate`` with ``transformers``' options (issue 41) on an imported GPT-2, token for token against
``transformers``' own ``generate``: beam search (``num_beams``, ``length_penalty``, ``early_stopping``,
``num_return_sequences``, EOS, the scores), ``repetition_penalty`` (greedy, sampled, in beams), ``max_length``,
``generation_config`` and the model's own generation defaults; left-padded prompts throughout."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers.hf_gpt2 import VOCAB, hf_gpt2  # noqa: E402
from interlayer.errors import UnsupportedGenerationOption  # noqa: E402
from interlayer.pretrained.hf import from_hf  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gpt2") / "untied"
    hf = hf_gpt2("untied")
    hf.save_pretrained(str(folder))
    return hf, from_hf(folder)


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of lengths 6, 4 and 3, left-padded (what transformers expects), and their mask."""
    ids = torch.randint(1, VOCAB, (3, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :3] = 0
    return ids, mask


def theirs(hf: Any, **kwargs: Any) -> Any:
    ids, mask = prompts()
    with torch.no_grad():
        return hf.generate(ids, attention_mask=mask, **kwargs)


def ours(model: torch.nn.Module, **kwargs: Any) -> Any:
    ids, mask = prompts()
    return model.generate(ids, attention_mask=mask, **kwargs)


def an_eos(model: torch.nn.Module) -> int:
    """The most likely first token of the first prompt: as EOS, a hypothesis finishes at once there while the
    other beams run on, and the later steps' stopping rules matter."""
    return int(ours(model, max_new_tokens=1, pad_token_id=1)[0, 6])


BEAMS = [dict(num_beams=3), dict(num_beams=4, num_return_sequences=3), dict(num_beams=3, length_penalty=0.5),
         dict(num_beams=3, length_penalty=-1.0), dict(num_beams=3, early_stopping=True),
         dict(num_beams=3, early_stopping="never", length_penalty=2.0), dict(num_beams=2, repetition_penalty=1.5)]


@pytest.mark.parametrize("eos", [False, True], ids=["no_eos", "eos"])
@pytest.mark.parametrize("options", BEAMS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_beam_search_equals_transformers(options: dict, eos: bool, pair) -> None:
    hf, model = pair
    common = dict(max_new_tokens=10, pad_token_id=1, eos_token_id=an_eos(model) if eos else None, **options)
    expected = theirs(hf, do_sample=False, output_scores=True, return_dict_in_generate=True, **common)
    got = ours(model, return_dict_in_generate=True, **common)
    assert got.sequences.tolist() == expected.sequences.tolist()
    assert torch.allclose(got.sequences_scores, expected.sequences_scores, atol=1e-5)


@pytest.mark.parametrize("options", [dict(do_sample=False, repetition_penalty=1.8),
                                     dict(do_sample=True, repetition_penalty=1.3, top_k=20, temperature=0.9),
                                     dict(do_sample=True, num_return_sequences=2),
                                     dict(do_sample=False, max_length=13)],
                         ids=["greedy_penalty", "sampled_penalty", "two_samples", "max_length"])
def test_greedy_and_sampling_options_equal_transformers(options: dict, pair) -> None:
    hf, model = pair
    common = dict(pad_token_id=1, **({} if "max_length" in options else {"max_new_tokens": 8}), **options)
    torch.manual_seed(5)
    expected = theirs(hf, **common)
    torch.manual_seed(5)
    assert ours(model, **common).tolist() == expected.tolist()


def test_generation_config_and_the_models_defaults(pair) -> None:
    """A passed GenerationConfig, the call's options over it, and the model's own generation_config (its
    config's EOS at first) as transformers uses them."""
    hf, model = pair
    config = transformers.GenerationConfig(max_new_tokens=6, num_beams=2, pad_token_id=1)
    assert ours(model, generation_config=config).tolist() == theirs(hf, generation_config=config).tolist()
    longer = ours(model, generation_config=config, max_new_tokens=9)
    assert longer.tolist() == theirs(hf, generation_config=config, max_new_tokens=9).tolist()
    assert model.config.eos_token_id == hf.config.eos_token_id == 0  # from the checkpoint's config.json
    assert model.generation_config.eos_token_id == 0
    eos = an_eos(model)
    model.generation_config.eos_token_id = eos
    hf.generation_config.eos_token_id = eos
    try:
        assert ours(model, max_new_tokens=8, pad_token_id=1).tolist() == theirs(hf, max_new_tokens=8,
                                                                                pad_token_id=1).tolist()
    finally:
        model.generation_config.eos_token_id = hf.generation_config.eos_token_id = 0


def test_options_it_does_not_implement_are_named(pair) -> None:
    _, model = pair
    with pytest.raises(UnsupportedGenerationOption, match="no_repeat_ngram_size=2"):
        ours(model, max_new_tokens=4, no_repeat_ngram_size=2)
    with pytest.raises(UnsupportedGenerationOption, match="beam sampling"):
        ours(model, max_new_tokens=4, num_beams=2, do_sample=True)
    with pytest.raises(ValueError, match="max_length=5 counts the prompt"):
        ours(model, max_length=5)


def test_dtype_on_import(pair, tmp_path: Path) -> None:
    hf, _ = pair
    hf.save_pretrained(str(tmp_path / "g"))
    for given in (dict(dtype=torch.bfloat16), dict(torch_dtype="bfloat16"), dict(dtype="auto")):
        model = from_hf(tmp_path / "g", **given)
        expected = torch.float32 if given.get("dtype") == "auto" else torch.bfloat16
        assert model.dtype == expected and not model.training, given
    with pytest.raises(TypeError, match="both dtype and torch_dtype"):
        from_hf(tmp_path / "g", dtype=torch.float16, torch_dtype=torch.float16)
