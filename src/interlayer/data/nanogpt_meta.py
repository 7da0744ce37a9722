"""nanoGPT's ``meta.pkl``: read without running anything, and written for character vocabularies.

nanoGPT's ``data/shakespeare_char/prepare.py`` pickles ``{"vocab_size": V, "itos": {id: char}, "stoi": {char: id}}``
beside ``train.bin`` and ``val.bin``, and ``sample.py`` reads the characters back from it (without it, it decodes
with GPT-2's BPE). Its content is plain data (a dict of ints and strings), but ``pickle.load`` would run whatever
callable a file names, so a folder from elsewhere could execute code. :func:`read_meta_pkl` therefore unpickles with
:class:`DataOnlyUnpickler`, which refuses **every** global (no class, no function, no ``copyreg`` extension: only
the pickle opcodes of dicts, lists, tuples, strings, bytes, numbers, booleans and None build anything), after a
bound on the file's size (:data:`MAX_BYTES`, far above a 65,536-entry vocabulary, so nothing larger is read at
all), and checks what it built: ``vocab_size`` an integer from 1 to 65,536; ``itos`` the ids ``0 .. V - 1``, each a
string; ``stoi`` its inverse when present. A character vocabulary (every ``itos`` entry one character) gives
``meta.json``'s ``chars``, which :func:`~interlayer.data.tokenizers.language_model.chars_tokenizer` checks against
nanoGPT's sorted order. Checkpoints are not read this way: a ``.pt`` pickle stays refused
(:mod:`interlayer.training.state_file`).

:func:`write_meta_pkl` writes the same dict for ``interlayer prepare lm``'s character corpora (plain data only, so
nanoGPT's ``sample.py`` reads it with its ``pickle.load``).
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..fileio import confined, write_atomic

PICKLED_META = "meta.pkl"
MAX_BYTES = 16 << 20  # a 65,536-entry vocabulary of long strings pickles to a few MiB
MAX_VOCAB = 1 << 16  # the token files' uint16 ids


class DataOnlyUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: every global a pickle names is refused (module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}; a meta.pkl holds plain data (dicts of ints and "
                                     "strings), and no global is loaded from a file")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent reference; a meta.pkl holds plain data only")


def read_meta_pkl(root: Path) -> dict[str, Any]:
    """``meta.json``'s keys from nanoGPT's ``root/meta.pkl`` (module docstring): ``vocab_size``, and ``chars`` (the
    characters in id order) when the vocabulary is characters. Raises :class:`DataError` naming the file and the
    fault for a file too large, one that names a global, one that is not plain data or not nanoGPT's layout."""
    path = confined(root / PICKLED_META, root, DataError)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise DataError(f"{root / PICKLED_META}: {size:,} bytes, more than the {MAX_BYTES:,} a vocabulary of "
                        f"{MAX_VOCAB:,} ids needs; not read")
    try:
        meta = DataOnlyUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception as err:  # the unpickler raises UnpicklingError, EOFError, ValueError, ... on a damaged file
        raise DataError(f"{root / PICKLED_META}: refused ({err}); write {root / 'meta.json'} as "
                        "{\"vocab_size\": N} instead (for characters also \"chars\": them in id order)") from None
    return _checked(meta, root / PICKLED_META)


def _checked(meta: Any, where: Path) -> dict[str, Any]:
    """``meta.json``'s form of nanoGPT's dict, its fields checked (module docstring)."""
    if not isinstance(meta, dict):
        raise DataError(f"{where}: a pickled {type(meta).__name__}, not nanoGPT's dict of vocab_size, itos and stoi")
    size = meta.get("vocab_size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_VOCAB:
        raise DataError(f"{where}: vocab_size={size!r} must be an integer from 1 to {MAX_VOCAB} (ids are uint16)")
    itos = meta.get("itos")
    if itos is None:
        return {"vocab_size": size}
    if not isinstance(itos, dict) or sorted(itos) != list(range(size)) or \
            not all(isinstance(token, str) for token in itos.values()):
        raise DataError(f"{where}: itos must map each id 0..{size - 1} to a string (nanoGPT's id -> character)")
    stoi = meta.get("stoi")
    if stoi is not None and stoi != {token: index for index, token in itos.items()}:
        raise DataError(f"{where}: stoi is not the inverse of itos; the file is damaged")
    tokens = [itos[index] for index in range(size)]
    if all(len(token) == 1 for token in tokens):
        return {"vocab_size": size, "chars": "".join(tokens)}
    return {"vocab_size": size}


def write_meta_pkl(folder: Path, chars: str) -> None:
    """nanoGPT's ``meta.pkl`` of a character vocabulary (``chars`` in id order), as its ``prepare.py`` writes it."""
    itos = dict(enumerate(chars))
    meta = {"vocab_size": len(chars), "itos": itos, "stoi": {c: i for i, c in itos.items()}}
    write_atomic(folder / PICKLED_META, pickle.dumps(meta))
