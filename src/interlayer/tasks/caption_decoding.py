"""Captioning's decoding and its self-critical training: sampling captions, beam search and greedy decoding from the
regions (translation's fairseq-style search, :mod:`.translation_decoding`, started from the encoded regions),
self-critical sequence training, and the nearest-neighbour baseline.

* **SCST** (Rennie et al. 2017, "Self-critical Sequence Training for Image Captioning"): for each image, captions
  are sampled from the model; each is rewarded by its CIDEr-D against the image's references (document
  frequencies from the training references); the gradient is ``-(r(w) - b) grad log p(w)``. The baseline ``b``
  is the reward of the model's own greedy caption (``scst_baseline="greedy"``, the paper's) or the mean reward
  of the image's other samples (``"mean"``: Luo 2020, "A Better Variant of Self-Critical Sequence Training",
  which needs no greedy pass). The log-probabilities are those of the sampled tokens up to and with the end of
  sentence, summed and divided by the batch's sampled tokens (the loss of the common implementations). Reading:
  the model samples and is differentiated in eval mode (no dropout), so that the gradient is that of the
  distribution the captions were drawn from.
* **Nearest-neighbour baseline** (Devlin et al. 2015, "Exploring Nearest Neighbor Approaches for Image
  Captioning"): a test image gets a caption of the training image whose mean region feature is nearest
  (Euclidean); among that image's references, the one with the highest CIDEr-D against the others (the
  consensus caption). It reads no model: the floor a captioner must clear by reading the regions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..data.bpe import BOS_ID, EOS_ID, PAD_ID
from ..data.region_features import RegionStore, region_batch
from ..training.device import module_device, move
from .caption_metrics import CiderD
from .translation_decoding import DecodeOptions, beam_from, greedy_from

ScstBaseline = Literal["greedy", "mean"]


def words_of(ids: Sequence[int], words: Sequence[str]) -> str:
    """The caption of token ids: the words up to the end of sentence, specials left out."""
    out = []
    for i in ids:
        if i == EOS_ID:
            break
        if i > 3:  # <pad> <s> </s> <unk>
            out.append(words[i])
    return " ".join(out)


@torch.no_grad()
def decode_captions(model: nn.Module, store: RegionStore, keys: Sequence[str], words: Sequence[str], *,
                    beam: int = 1, batch_size: int = 100) -> dict[str, str]:
    """A caption per image key: greedy (``beam=1``) or beam search, at most ``max_words`` words."""
    model.eval()
    device = module_device(model)
    limit = model.config.max_words + 1
    options = DecodeOptions(beam=beam)
    out: dict[str, str] = {}
    for start in range(0, len(keys), batch_size):
        chunk = list(keys[start:start + batch_size])
        features, boxes, padding = move(region_batch([store.regions(k) for k in chunk], model.config.max_regions),
                                        device)
        enc = model.encode(features, boxes, padding)
        limits = torch.full((len(chunk),), limit, dtype=torch.long, device=device)
        search = greedy_from if beam == 1 else beam_from
        for key, ids in zip(chunk, search(model, enc.hidden, enc.padding_mask, limits, options)):
            out[key] = words_of(ids, words)
    return out


@torch.no_grad()
def sample_captions(model: nn.Module, memory: Tensor, memory_mask: Optional[Tensor], max_len: int,
                    generator: Optional[torch.Generator] = None) -> Tensor:
    """One sampled caption per row of ``memory``, ``(B, L)`` token ids ending in EOS (or cut at ``max_len``
    tokens, EOS included), PAD after it; PAD and BOS are never drawn."""
    batch = memory.shape[0]
    tokens = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=memory.device)
    done = torch.zeros(batch, dtype=torch.bool, device=memory.device)
    cache = model.decoder.new_cache()
    for step in range(max_len):
        logits = model.decoder(tokens[:, -1:], memory, memory_mask, cache=cache).logits[:, -1].float()
        logits[:, PAD_ID] = -torch.inf
        logits[:, BOS_ID] = -torch.inf
        probs = torch.softmax(logits, dim=-1)
        choice = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(memory.device)
        if step == max_len - 1:
            choice = torch.full_like(choice, EOS_ID)
        choice = choice.masked_fill(done, PAD_ID)
        tokens = torch.cat([tokens, choice[:, None]], dim=1)
        done |= choice.eq(EOS_ID)
        if bool(done.all()):
            break
    return tokens[:, 1:]


@dataclass
class ScstBatch:
    keys: list[str]
    features: Tensor
    boxes: Tensor
    padding: Optional[Tensor]


class SelfCritical:
    """The engine's task for SCST (module docstring): batches of training images, the policy-gradient loss, and the
    captioning task's validation and assets."""

    metric = "cider"
    higher_is_better = True
    device = torch.device("cpu")

    def __init__(self, captioning: Any, baseline: ScstBaseline, samples: int, images_per_step: int) -> None:
        self.captioning, self.baseline, self.samples = captioning, baseline, samples
        self.images_per_step = images_per_step
        self.keys = list(captioning.train_split.images)
        self.cider = captioning.train_cider()
        self.words = captioning.vocab

    def model_fields(self) -> dict[str, Any]:
        return self.captioning.model_fields()

    def train_batches(self, epoch: int, seed: int) -> list[list[int]]:
        order = torch.randperm(len(self.keys), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        return [chunk.tolist() for chunk in order.split(self.images_per_step)]

    def prepare(self, rows: list[int]) -> ScstBatch:
        keys = [self.keys[r] for r in rows]
        store = self.captioning.train_split.store
        features, boxes, padding = region_batch([store.regions(k) for k in keys], self.captioning.data.max_regions)
        return ScstBatch(keys, features, boxes, padding)

    def rewards(self, keys: Sequence[str], ids: Tensor) -> Tensor:
        """CIDEr-D (coco-caption's 0..10 scale) of each row's caption against its image's references."""
        return torch.tensor([self.cider.score_one(key, words_of(row, self.words)) for key, row in
                             zip(keys, ids.tolist())])

    def loss(self, train_model: nn.Module, batch: ScstBatch) -> tuple[Tensor, dict[str, Tensor], int]:
        model = getattr(train_model, "module", train_model)  # DDP's wrapper has no encode / decoder
        model.eval()  # the policy sampled is the one differentiated (module docstring)
        n, max_len = self.samples, model.config.max_words + 1
        expand = torch.arange(len(batch.keys), device=batch.features.device).repeat_interleave(n)
        padding = batch.padding[expand] if batch.padding is not None else None
        features, boxes = batch.features[expand], batch.boxes[expand]
        with torch.no_grad():
            enc = model.encode(features, boxes, padding)
            sampled = sample_captions(model, enc.hidden, enc.padding_mask, max_len)
        keys = [key for key in batch.keys for _ in range(n)]
        reward = self.rewards(keys, sampled)
        if self.baseline == "greedy":
            with torch.no_grad():
                first = torch.arange(0, len(keys), n, device=sampled.device)
                limits = torch.full((len(batch.keys),), max_len, dtype=torch.long, device=sampled.device)
                greedy = greedy_from(model, enc.hidden[first], None if padding is None else enc.padding_mask[first],
                                     limits, DecodeOptions(beam=1))
            base = torch.tensor([self.cider.score_one(key, words_of(ids, self.words))
                                 for key, ids in zip(batch.keys, greedy)]).repeat_interleave(n)
        else:  # the mean reward of the image's other samples
            grouped = reward.view(-1, n)
            base = ((grouped.sum(1, keepdim=True) - grouped) / max(n - 1, 1)).view(-1)
        advantage = (reward - base).to(sampled.device)
        inputs = torch.cat([torch.full_like(sampled[:, :1], BOS_ID), sampled[:, :-1]], dim=1)
        mask = sampled.ne(PAD_ID)
        logits = train_model(features, boxes, padding, inputs.masked_fill(~mask, PAD_ID)).logits.float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, sampled[..., None]).squeeze(-1)
        loss = -(advantage[:, None] * logp * mask).sum() / mask.sum()
        logs = {"loss": loss.detach(), "reward": reward.mean().to(loss.device),
                "baseline": base.mean().to(loss.device)}
        return loss, logs, len(keys)

    def validate(self, model: nn.Module) -> dict[str, float]:
        return self.captioning.validate(model)

    def save_assets(self, directory: Any) -> None:
        self.captioning.save_assets(directory)


# -- the nearest-neighbour baseline -------------------------------------------------------------------------------
def mean_features(store: RegionStore, keys: Sequence[str], max_regions: int) -> np.ndarray:
    """(N, F) float64: each image's mean region feature (its first ``max_regions`` regions)."""
    return np.stack([store.regions(k).ordered(max_regions).features.mean(0) for k in keys]).astype(np.float64)


def nearest_neighbour_captions(train_store: RegionStore, train_refs: dict[str, list[str]], cider: CiderD,
                               test_store: RegionStore, test_keys: Sequence[str], max_regions: int,
                               chunk: int = 1024) -> dict[str, str]:
    """For each test image, the consensus reference (:meth:`CiderD.consensus`, ``cider`` over the training
    references) of the training image nearest by mean region feature (module docstring)."""
    train_keys = list(train_refs)
    train = mean_features(train_store, train_keys, max_regions)
    test = mean_features(test_store, test_keys, max_regions)
    norms = (train ** 2).sum(1)
    out: dict[str, str] = {}
    for start in range(0, len(test), chunk):
        block = test[start:start + chunk]
        for key, i in zip(test_keys[start:start + chunk], np.argmin(norms[None, :] - 2 * block @ train.T, axis=1)):
            neighbour = train_keys[int(i)]
            out[key] = train_refs[neighbour][cider.consensus(neighbour)]
    return out
