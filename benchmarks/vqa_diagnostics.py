"""Does a trained MCAN find the object a Sort-of-CLEVR question names? Diagnostics behind docs/vqa.md's reading.

For each run directory (``interlayer train vqa`` or the runs of ``interlayer compare --task vqa``), on its test
split, without noise:

* **accuracy** overall, relational, non-relational, and on the question sub-type that needs nothing but the named
  object (*what is the shape of the red object ?*);
* **changed by shuffled images**: the share of predictions that change when the images are handed to other
  questions (a fixed permutation of the test split): 0 means the model answers from the words alone;
* **spread** of the image stack's states: the standard deviation across one image's regions (mean over features
  and images) after the projection to ``d_model`` and after each SGA block. A stack whose regions all end in the
  same state cannot tell the AttFlat which region to weight: the object the question names is lost.

* **fixed by sub-type and square count**: group the test questions by their sub-type and by the number of squares
  among the image's six objects (an image-wide statistic that finds no object by its colour) and count the
  predictions that equal their group's most frequent prediction. 100 means the model's answer is a function of
  those two alone: it reads how many squares the image holds and nothing about the object the question names.
  ``--references`` prints the accuracy of the best such function on the training answers (each group's most
  frequent training answer) and of the question-only one.

``--reader EPOCHS`` instead trains a small reference model that is not MCAN on the object regions: the question's
final LSTM state is the query of one softmax attention over the six regions, and an MLP reads the question state
and the attended region. It asks whether the binding of a colour word to its region can be learned from these
features at all within a short budget.

    python benchmarks/vqa_diagnostics.py RUN_DIR [RUN_DIR ...]
    python benchmarks/vqa_diagnostics.py --references
    python benchmarks/vqa_diagnostics.py --reader 6 [--seed 1]
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from interlayer.config_io import dataclass_from_dict
from interlayer.data import sort_of_clevr as soc
from interlayer.errors import DataError
from interlayer.fileio import read_json
from interlayer.models.registry import load_pretrained
from interlayer.tasks.vqa import VQATask, score
from interlayer.tasks.vqa_data import Split, Vocab, VQAData, load_test_split
from interlayer.training.config import TrainConfig

RuleKey = Callable[[soc.SortOfClevr, int], tuple]


def question_only(data: soc.SortOfClevr, i: int) -> tuple:
    return (data.kinds[i],)


def question_and_square_count(data: soc.SortOfClevr, i: int) -> tuple:
    return data.kinds[i], int((data.shapes[data.image_index[i]] == 0).sum())


def rule_answers(train: soc.SortOfClevr, test: soc.SortOfClevr, key: RuleKey) -> np.ndarray:
    """Each test question's answer index under the rule "the most frequent training answer of the question's key"
    (-1 for a key never seen in training). The colour word is in neither key: with it, a non-relational answer
    depends on the named object, which neither rule locates."""
    counts: defaultdict[tuple, Counter] = defaultdict(Counter)
    for i in range(len(train)):
        counts[key(train, i)][int(train.answers[i])] += 1
    return np.array([counts[key(test, i)].most_common(1)[0][0] if key(test, i) in counts else -1
                     for i in range(len(test))])


def references(data: VQAData) -> None:
    """The two rules' test accuracy, overall, relational and non-relational, as a markdown table."""
    train = soc.generate(data.train_size, data.release_seed, "train")
    test = soc.generate(data.test_size, data.release_seed, "test")
    print("| reference | accuracy | relational | non-relational |\n|---|---|---|---|")
    for name, key in (("question only", question_only), ("question + number of squares", question_and_square_count)):
        right = rule_answers(train, test, key) == test.answers
        print(f"| {name} | {100 * right.mean():.1f} | {100 * right[test.relational].mean():.1f} | "
              f"{100 * right[~test.relational].mean():.1f} |")


def region_spread(model: nn.Module, split: Split, batch_size: int = 250) -> list[float]:
    """Mean over images and features of the standard deviation across an image's regions: after the projection
    to ``d_model`` and after each SGA block (forward hooks; images without padded regions only)."""
    captured: list[list[Tensor]] = [[] for _ in range(1 + len(model.decoder.layers))]

    def keep(index: int):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            states = output[0] if isinstance(output, tuple) else output
            captured[index].append(states.detach().std(dim=1).mean(dim=-1))
        return hook

    handles = [model.image_proj.register_forward_hook(keep(0))]
    handles += [layer.register_forward_hook(keep(i + 1)) for i, layer in enumerate(model.decoder.layers)]
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(split), batch_size):
                rows = range(start, min(start + batch_size, len(split)))
                question, padding, image, image_padding = split.inputs(rows)
                if image_padding is not None and bool(image_padding.any()):
                    raise ValueError("region_spread reads unpadded region sets (Sort-of-CLEVR) only")
                model(question, padding, image, image_padding)
    finally:
        for handle in handles:
            handle.remove()
    return [float(torch.cat(values).mean()) for values in captured]


def shuffled_change(model: nn.Module, split: Split, seed: int = 0, batch_size: int = 250) -> float:
    """Percent of test predictions that change when each question gets another question's image."""
    permutation = np.random.default_rng(seed).permutation(len(split))
    changed = 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(split), batch_size):
            rows = list(range(start, min(start + batch_size, len(split))))
            question, padding, image, image_padding = split.inputs(rows)
            other_image, other_padding = split.images.batch([split.items[int(permutation[r])].image for r in rows])
            clean = model(question, padding, image, image_padding).logits.argmax(-1)
            shuffled = model(question, padding, other_image, other_padding).logits.argmax(-1)
            changed += int((clean != shuffled).sum())
    return 100.0 * changed / len(split)


def diagnose(run: Path) -> str:
    """One markdown row for the run's best checkpoint."""
    best = run / "best" if (run / "best").is_dir() else run
    data = dataclass_from_dict(VQAData, read_json(best / "data.json", DataError), "data.")
    if data.dataset != "sort_of_clevr":
        raise SystemExit(f"{run}: the diagnostics read Sort-of-CLEVR runs; this one is {data.dataset}")
    info = read_json(best / "task.json", DataError)
    vocab = Vocab(info["words"], info["answers"])
    model = load_pretrained(best)
    split = load_test_split(data, vocab)
    metrics = score(model, split, vocab, data.dataset, samples=0)
    test = soc.generate(data.test_size, data.release_seed, "test")
    groups: defaultdict[tuple, Counter] = defaultdict(Counter)
    for i, answer in enumerate(metrics["predicted"]):
        groups[question_and_square_count(test, i)][answer] += 1
    fixed = 100.0 * sum(max(counts.values()) for counts in groups.values()) / len(test)
    spread = " | ".join(f"{value:.3g}" for value in region_spread(model, split))
    return (f"| {run.name} | {metrics['accuracy']:.1f} | {metrics['accuracy_relational']:.1f} | "
            f"{metrics['accuracy_non_relational']:.1f} | {metrics['per_type'].get('shape', float('nan')):.1f} | "
            f"{shuffled_change(model, split):.1f} | {fixed:.1f} | {spread} |")


class QueryReader(nn.Module):
    """The reference reader of ``--reader``: the question state queries the regions (module docstring)."""

    def __init__(self, vocab_size: int, num_answers: int, feature_dim: int, d: int = 64) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab_size, d, padding_idx=0)
        self.lstm = nn.LSTM(d, d, batch_first=True)
        self.regions = nn.Linear(feature_dim, d)
        self.keys = nn.Linear(d, d)
        self.query = nn.Linear(d, d)
        self.out = nn.Sequential(nn.Linear(2 * d, 2 * d), nn.ReLU(), nn.Linear(2 * d, num_answers))

    def forward(self, question: Tensor, padding: Tensor, image: Tensor, image_padding: object = None) -> Tensor:
        states, _ = self.lstm(self.words(question))
        last = states[torch.arange(len(question)), (~padding).sum(1) - 1]
        regions = self.regions(image)
        weights = torch.softmax(self.keys(regions) @ self.query(last)[:, :, None] / regions.shape[-1] ** 0.5, dim=1)
        return self.out(torch.cat([last, (weights * regions).sum(1)], dim=-1))


def train_reader(epochs: int, seed: int) -> None:
    """Train :class:`QueryReader` on the object regions (Adam 1e-3, batches of 64) and print the test accuracy
    per sub-type after every epoch."""
    torch.manual_seed(seed)
    task = VQATask(VQAData(image_features="objects"), TrainConfig())
    test = load_test_split(task.data, task.vocab)
    model = QueryReader(len(task.vocab.words), len(task.vocab.answers), soc.OBJECT_FEATURE_DIM)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    answers = torch.tensor([task.vocab.answer_index[item.label] for item in test.items])
    kinds = np.array([item.question_type for item in test.items])
    print(f"| epoch | accuracy | {' | '.join(soc.TEMPLATES)} |\n|---|---|{'---|' * len(soc.TEMPLATES)}")
    for epoch in range(epochs):
        model.train()
        for batch in task.train_batches(epoch, seed):
            rows = batch.tolist()
            logits = model(*task.train_set.inputs(rows))
            target = task.train_set.target_matrix(rows, len(task.vocab.answers))
            loss = F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / len(rows)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            right = (model(*test.inputs(range(len(test)))).argmax(-1) == answers).numpy()
        per_kind = " | ".join(f"{100 * right[kinds == kind].mean():.1f}" for kind in soc.TEMPLATES)
        print(f"| {epoch + 1} | {100 * right.mean():.1f} | {per_kind} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run directories (or their best/ checkpoints)")
    parser.add_argument("--reader", type=int, default=0, metavar="EPOCHS",
                        help="train the reference reader for EPOCHS epochs instead")
    parser.add_argument("--references", action="store_true",
                        help="print the question-only and square-count rules' accuracy on the default release")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.reader:
        train_reader(args.reader, args.seed)
        return
    if args.references:
        references(VQAData())
        return
    if not args.runs:
        parser.error("give run directories, --references or --reader EPOCHS")
    rows = [diagnose(run) for run in args.runs]
    blocks = len(rows[0].split("|")) - 10
    print("| run | accuracy | relational | non-relational | shape of X | changed by shuffled images | fixed by "
          f"sub-type and square count | spread: projection | {' | '.join(f'block {i + 1}' for i in range(blocks))} |")
    print("|---" * (8 + blocks) + "|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
