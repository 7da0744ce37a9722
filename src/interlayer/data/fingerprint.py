"""What a run's data is, by content: each file's size and SHA-256, so that a resume can tell the data it trained on
from another.

A run records the fingerprint of the files its task read (``run.json``'s ``data_fingerprint``; a task lists them
with ``data_files()``, each under a *role*: its name inside the corpus's folder, or the split it holds), and a
resume compares the files it finds with it: a folder replaced by another corpus, a shard deleted, a file edited,
are each named with their sizes and digests, and refused unless the user says the change is meant
(``--allow-data-change``). Names are roles, not absolute paths, and the digests are of the contents, so a moved
or copied folder holding the same bytes is the same data.

Hashing reads every byte once (about a second per gigabyte); a resume reuses the digest recorded for a file whose
size and modification time are the recorded ones (the same file, untouched: a folder moved on one file system keeps
both), so only a changed or copied file is read again.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..errors import DataError

CHUNK_BYTES = 1 << 24


def file_sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes, read in chunks (never the whole file at once)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                digest.update(chunk)
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror})") from None
    return digest.hexdigest()


def fingerprint(files: Sequence[tuple[str, Path]], known: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """``{"files": {role: {"bytes", "mtime_ns", "sha256"}}, "sha256": ...}`` of ``files`` (role, path); the top
    digest covers every role and its file's digest. ``known``: an earlier fingerprint whose digests are reused
    for files of the same role, size and modification time."""
    before = dict((known or {}).get("files", {}))
    records: dict[str, dict[str, Any]] = {}
    for role, path in files:
        try:
            stat = Path(path).stat()
        except OSError as err:
            raise DataError(f"{path}: cannot read ({err.strerror})") from None
        old = before.get(role, {})
        same = old.get("bytes") == stat.st_size and old.get("mtime_ns") == stat.st_mtime_ns and "sha256" in old
        records[role] = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                         "sha256": old["sha256"] if same else file_sha256(Path(path))}
    top = hashlib.sha256("".join(f"{role}\0{r['sha256']}\n" for role, r in sorted(records.items())).encode())
    return {"files": records, "sha256": top.hexdigest()}


def changed_files(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """How the data of fingerprint ``new`` differs from ``old``'s, file by file (none: the same bytes)."""
    if old.get("sha256") == new.get("sha256"):
        return []
    before, after = old.get("files", {}), new.get("files", {})
    out = [f"{role} is gone" for role in sorted(set(before) - set(after))]
    out += [f"{role} is new ({after[role]['bytes']:,} bytes)" for role in sorted(set(after) - set(before))]
    out += [f"{role}: {before[role].get('bytes', 0):,} bytes (sha256 {str(before[role].get('sha256'))[:12]}) when "
            f"the run started, {after[role]['bytes']:,} bytes (sha256 {after[role]['sha256'][:12]}) now"
            for role in sorted(set(before) & set(after)) if before[role].get("sha256") != after[role]["sha256"]]
    return out or ["the files' digests differ"]
