"""What an export carries besides the weights: the tokenizer, the labels' names and a model card.

A model loaded with :func:`interlayer.load_pretrained` remembers its folder (``model.source_dir``); when that
folder was written by ``interlayer train`` (``RUN_DIR/best``) it holds the run's tokenizer, ``task.json`` (the
labels' names), ``data.json``, and its parent the run's ``run.json`` (settings and command) and ``results.json``
(scores). :func:`read_run_assets` gathers them, so that ``to_hf(load_pretrained("runs/.../best"), out)`` writes
what a ``transformers`` user needs without being told; an imported model (``from_hf``) brings its tokenizer and
import report instead. :func:`model_card` writes them down as the folder's ``README.md``.

Tokenizers a run may hold, and their Hugging Face form: a fine-tuning run's WordPiece or BPE tokenizer (the
checkpoint's own files: written back as they are), a language model's byte-level BPE or characters (a
``tokenizers`` pipeline in ``tokenizer.json``, which ``AutoTokenizer`` loads; GPT-2's own files for a GPT-2
export of a byte-level BPE), or a from-scratch classifier's word vocabulary (no ``transformers`` tokenizer
reproduces it here: an export refuses it by name, or with ``tokenizer=False`` leaves it out).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Optional

from torch import nn

from ..data.classification import VOCAB_FILE as WORD_VOCAB_FILE
from ..data.tokenizers.language_model import (
    TOKENIZER_FILE,
    ByteBPETokenizer,
    CharTokenizer,
    lm_tokenizer_kind,
    load_lm_tokenizer,
)
from ..data.tokenizers.pretrained import (
    BPE_MERGES_FILE,
    BPE_VOCAB_FILE,
    SPECIAL_TOKENS_FILE,
    TOKENIZER_CONFIG_FILE,
    WORDPIECE_VOCAB_FILE,
    tokenizer_kind,
)
from ..errors import CheckpointError
from ..fileio import confined
from .hf_checkpoint import AnyTokenizer, load_tokenizer

# Files a run folder's tokenizer may consist of (HF's and interlayer's), copied by an own-format export.
TOKENIZER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE, WORDPIECE_VOCAB_FILE, BPE_VOCAB_FILE,
                   BPE_MERGES_FILE)
RUN_FILES = ("task.json", "data.json")  # the run's description of its task and data, beside the model


@dataclass
class RunAssets:
    """What came with a model: its folder's tokenizer, labels and run record (each empty when unknown)."""

    directory: Optional[Path] = None  # the folder the model was loaded from
    tokenizer: Optional[AnyTokenizer] = None  # one with a transformers form
    unexportable_tokenizer: Optional[str] = None  # names a tokenizer the run had but transformers cannot load
    labels: Optional[list[str]] = None
    task: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    base_model: Optional[str] = None


def _json(path: Path, folder: Path) -> dict[str, Any]:
    """The JSON object in ``path`` inside ``folder``; ``{}`` when it is missing or damaged (a run's record is an
    extra of the model card), but a link out of the folder or a special file is refused
    (:func:`~interlayer.fileio.confined`)."""
    if not os.path.lexists(path):
        return {}
    source = confined(path, folder, CheckpointError)
    try:
        data = json.loads(source.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_run_assets(model: nn.Module) -> RunAssets:
    """The assets of ``model``'s folder and run (module docstring); an imported model's tokenizer and source."""
    assets = RunAssets(tokenizer=getattr(model, "tokenizer", None))
    report = getattr(model, "import_report", None)
    if report is not None:
        assets.base_model = report.source
    directory = getattr(model, "source_dir", None)
    if directory is None:
        return assets
    directory = assets.directory = Path(directory)
    assets.task, assets.data = _json(directory / "task.json", directory), _json(directory / "data.json", directory)
    run_dir = directory.parent
    if os.path.lexists(run_dir / "run.json"):
        assets.run, assets.results = _json(run_dir / "run.json", run_dir), _json(run_dir / "results.json", run_dir)
    names = assets.task.get("labels") or assets.task.get("class_names")
    if isinstance(names, list) and names:
        assets.labels = [str(name) for name in names]
    pretrained = assets.task.get("pretrained")
    if isinstance(pretrained, dict) and pretrained.get("source"):
        assets.base_model = str(pretrained["source"])
    if assets.tokenizer is None:
        assets.tokenizer, assets.unexportable_tokenizer = _folder_tokenizer(directory)
    return assets


def _folder_tokenizer(directory: Path) -> tuple[Optional[AnyTokenizer], Optional[str]]:
    """(the folder's tokenizer when transformers can load it, else a phrase naming the one it has)."""
    if lm_tokenizer_kind(directory) is not None:
        return load_lm_tokenizer(directory), None
    if tokenizer_kind(directory) is not None:
        return load_tokenizer(directory), None
    if os.path.lexists(directory / WORD_VOCAB_FILE):
        return None, f"the run's vocabulary ({directory / WORD_VOCAB_FILE}: interlayer's own format)"
    return None, None


def copy_run_files(assets: RunAssets, directory: Path, *, tokenizer_files: bool = True) -> list[str]:
    """Copy the task files and (with ``tokenizer_files``) the tokenizer files of the model's folder into
    ``directory`` (an export in interlayer's format); each must be a regular file of that folder
    (:func:`~interlayer.fileio.confined`: a link out of it is refused, not copied)."""
    copied = []
    names = (*TOKENIZER_FILES, WORD_VOCAB_FILE, *RUN_FILES) if tokenizer_files else RUN_FILES
    if assets.directory is not None:
        for name in names:
            if os.path.lexists(assets.directory / name) and name not in copied:
                shutil.copyfile(confined(assets.directory / name, assets.directory, CheckpointError), directory / name)
                copied.append(name)
    return copied


def _plain(value: Any) -> Any:
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


def describe_tokenizer(tokenizer: Any) -> str:
    """What a tokenizer is, in words, with its size: the one a model card states."""
    if isinstance(tokenizer, CharTokenizer):
        return f"characters, {len(tokenizer):,} ids"
    if isinstance(tokenizer, ByteBPETokenizer):
        return f"byte-level BPE, {len(tokenizer):,} ids"
    kind = {"WordPieceTokenizer": "WordPiece", "BPETokenizer": "byte-level BPE"}.get(type(tokenizer).__name__,
                                                                                      type(tokenizer).__name__)
    return f"{kind}, {tokenizer.vocab_size:,} ids"


def model_card(model: nn.Module, assets: RunAssets, *, library: str, architecture: str,
               note: Optional[str] = None, tokenizer: Any = None, with_code: bool = False) -> str:
    """README.md of an exported folder: base model, methods and their settings, the tokenizer written with it, the
    run's data, scores and command, and how to load it (``library``: ``transformers`` for a ``transformers``
    family's classes, ``interlayer`` for interlayer's; ``with_code``: the folder carries interlayer's code)."""
    tokenizer = assets.tokenizer if tokenizer is None else tokenizer
    cfg = getattr(model, "config", None)
    core = getattr(cfg, "encoder", cfg)  # an image model's config holds its encoder's
    sections = core.sections() if hasattr(core, "sections") else []
    methods = [m.name for m, _ in sections]
    front = ["---", f"library_name: {library}", "tags:", "- interlayer", *[f"- {name}" for name in methods]]
    if assets.base_model:
        front.append(f"base_model: {assets.base_model}")
    lines = [*front, "---", "", f"# {architecture}", ""]
    lines.append(f"Exported by interlayer from `{assets.directory}`." if assets.directory else
                 "Exported by interlayer.")
    if note:
        lines += ["", note]
    lines += ["", "## Model", "", f"- class: {architecture}",
              f"- parameters: {sum(p.numel() for p in model.parameters()):,}"]
    if assets.base_model:
        lines.append(f"- base model: {assets.base_model}")
    if sections:
        lines += [f"- method {m.name}: `{json.dumps(_plain(section), sort_keys=True)}`" for m, section in sections]
    else:
        lines.append("- methods: none (a plain Transformer)")
    if assets.labels:
        lines.append(f"- labels: {', '.join(assets.labels)}")
    if tokenizer is not None:
        lines.append(f"- tokenizer: {describe_tokenizer(tokenizer)}"
                     + (f" (the base model's, {assets.base_model})" if assets.base_model else ""))
    elif assets.unexportable_tokenizer:
        lines.append(f"- tokenizer: {assets.unexportable_tokenizer}, not written (transformers cannot load it)")
    if assets.task or assets.run:
        lines += ["", "## Training", ""]
        if assets.task.get("task"):
            lines.append(f"- task: {assets.task['task']}")
        if assets.data:
            data = dict(assets.data)
            if assets.base_model:  # the checkpoint's tokenizer replaced these settings
                data = {k: v for k, v in data.items() if k not in ("tokenizer", "vocab_size")}
            lines.append(f"- data: `{json.dumps(data, sort_keys=True)}`")
        if assets.run.get("train"):
            lines.append(f"- training settings: `{json.dumps(assets.run['train'], sort_keys=True)}`")
        if assets.run.get("command"):
            lines.append(f"- command: `{' '.join(assets.run['command'])}`")
    scores = {key: value for key, value in assets.results.items()
              if key == "best_valid" or key.startswith("test_") or key in ("steps", "epochs", "train_minutes")}
    if scores:
        lines += ["", "## Results", "", *[f"- {key}: {json.dumps(value)}" for key, value in scores.items()]]
    lines += ["", "## Use", ""]
    tokenizer_call = " and `AutoTokenizer.from_pretrained(folder)`" if tokenizer is not None else ""
    auto = auto_class_of(architecture)
    if library == "transformers":
        lines.append(f"`transformers`: `{auto}.from_pretrained(folder)`{tokenizer_call}.")
    else:
        lines.append(f"`transformers`, after `import interlayer` (which registers its classes): "
                     f"`{auto}.from_pretrained(folder)`{tokenizer_call}; `pipeline(...)` and `Trainer` take it.")
        if with_code:
            lines.append("")
            lines.append(f"Without interlayer installed: `{auto}.from_pretrained(folder, trust_remote_code=True)` "
                         "runs the copy of interlayer's model code in this folder (read it first, as any remote "
                         "code).")
        lines += ["", "`interlayer`: `interlayer.load_pretrained(folder)`."]
    return "\n".join(lines) + "\n"


def auto_class_of(architecture: str) -> str:
    """The ``transformers`` Auto class that loads ``architecture``."""
    for suffix, auto in (("ForSequenceClassification", "AutoModelForSequenceClassification"),
                         ("ForImageClassification", "AutoModelForImageClassification"),
                         ("LMHeadModel", "AutoModelForCausalLM"), ("ForCausalLM", "AutoModelForCausalLM")):
        if architecture.endswith(suffix):
            return auto
    return "AutoModel"

