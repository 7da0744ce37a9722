"""Planetoid citation graphs (Cora, Citeseer) with the split of Yang et al. (2016) that GAT and Crossformer use.

Two formats, one :class:`PlanetoidGraph`:

* **raw** ``DIR/ind.NAME.{x,y,tx,ty,allx,ally,graph,test.index}`` as published by Yang et al.
  (github.com/kimiyoung/planetoid, MIT licence): Python 2 pickles of scipy CSR matrices, numpy arrays and a
  ``defaultdict`` of neighbour lists, plus a text file of test node ids. Pass the prefix ``DIR/ind.NAME``.
* **npz** (``numpy.savez_compressed``, read with ``allow_pickle=False``): what :func:`save_npz` writes and what is
  bundled under ``data/bundled/planetoid/``. Pass the ``.npz`` path.

Why a restricted unpickler: ``pickle.load`` runs whatever callable a file names, so a tampered ``ind.*`` file could
execute code. :class:`SafeUnpickler` admits exactly the globals these files contain (numpy's array reconstruction,
``numpy.dtype``, scipy's ``csr_matrix``, ``collections.defaultdict``, ``list``) and refuses every other one with a
:class:`DataError` naming the file and the global. scipy is not needed: a pickled ``csr_matrix`` is read into a
plain record of its arrays (``data``, ``indices``, ``indptr``, ``_shape``), which is all it holds.

The assembly follows Kipf & Welling's ``load_data`` (gcn/utils.py), which GAT's ``process.load_data`` copies and
PyTorch Geometric's ``read_planetoid_data`` reproduces:

* nodes ``0 .. len(allx)-1`` take the rows of ``allx``/``ally``; node ``test.index[k]`` takes row ``k`` of
  ``tx``/``ty``;
* **Citeseer's isolated nodes**: 15 ids inside ``[min(test.index), max(test.index)]`` appear in no file (they have
  no features in the original data). Like Kipf and PyG we keep them as nodes with all-zero features and no label
  (stored here as label ``-1``; Kipf/PyG's one-hot row is all zeros), in no split. Citeseer thus has 3,327 nodes.
* splits: train = the first ``len(y)`` nodes (20 per class), validation = the next 500, test = the sorted
  ``test.index`` (1,000);
* edges: the ``graph`` dict read as an undirected graph (networkx ``from_dict_of_lists`` in Kipf's loader), so
  every edge is stored in both directions, duplicates merged and self-loops dropped (GAT adds exactly one
  self-loop per node itself). Cora: 10,556 directed edges, Citeseer: 9,104 (PyG's counts).

What the model is built from is checked, because a bad value would not fail, only train badly: feature values must
be finite (a NaN trains to a NaN loss at chance accuracy), feature indices must lie within the declared width
(``feat_shape`` of a .npz, the CSR shape of a raw file), and labels within the declared classes. **Declared
classes**: in the raw format the width of the one-hot label matrices (``y``, ``ty`` and ``ally`` must agree); in a
.npz the array ``num_classes``, which :func:`save_npz` writes. A .npz without it (the bundled files, older ones)
infers the classes as ``0..max(label)`` and requires a node of every one, so a stray label of 50 among classes 0-6
is refused instead of silently making a 51-class model.

Every problem raises :class:`DataError` naming the file (and the line, for ``test.index``; the node and feature
index, for features and labels).
"""
from __future__ import annotations

import collections
import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from .parallel import resolve_path
from .text import iter_lines

PathLike = Union[str, Path]
RAW_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")
NPZ_KEYS = ("name", "feat_data", "feat_indices", "feat_indptr", "feat_shape", "labels", "edges", "train", "valid",
            "test")
CLASSES_KEY = "num_classes"  # optional in a .npz (files written before it infer the classes from the labels)


class CsrRecord:
    """The state of a pickled ``scipy.sparse.csr_matrix``: its arrays, without scipy."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.state = state

    def arrays(self, source: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
        """(data, indices, indptr, shape), checked to form a valid CSR matrix."""
        state = getattr(self, "state", None)
        if not isinstance(state, dict) or not {"data", "indices", "indptr", "_shape"} <= set(state):
            raise DataError(f"{source}: the pickled csr_matrix lacks data/indices/indptr/_shape")
        data, indices, indptr = (np.asarray(state[k]) for k in ("data", "indices", "indptr"))
        rows, cols = (int(n) for n in state["_shape"])
        if (indptr.shape != (rows + 1,) or indptr[0] != 0 or indptr[-1] != len(data) or len(indices) != len(data)
                or np.any(np.diff(indptr) < 0)):
            raise DataError(f"{source}: the pickled csr_matrix of shape {(rows, cols)} is inconsistent (indptr, "
                            "indices and data do not fit together)")
        arrays = data.astype(np.float32), indices.astype(np.int64), indptr.astype(np.int64), (rows, cols)
        check_features(*arrays, source)
        return arrays


def check_features(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, int],
                   source: Path) -> None:
    """Feature values must be finite (a NaN feature trains to a NaN loss at chance accuracy) and every column index
    must lie within the declared width ``shape[1]`` (the model's input width is that number). Errors name the node
    and the feature index."""
    width = shape[1]
    if len(data) != len(indices):
        raise DataError(f"{source}: {len(data)} feature values but {len(indices)} feature indices")
    # the row pointer (CSR; its length and end are checked with the graph): offsets from 0 that never decrease
    if len(indptr) and indptr[0] != 0:
        raise DataError(f"{source}: feat_indptr starts at {int(indptr[0])}; the offsets of node 0 start at 0")
    falling = np.flatnonzero(np.diff(indptr) < 0)
    if len(falling):
        node = int(falling[0])
        raise DataError(f"{source}: feat_indptr falls at node {node} ({int(indptr[node])} -> {int(indptr[node + 1])}); "
                        f"the offsets must never decrease ({len(falling)} such nodes in all)")
    outside = np.flatnonzero((indices < 0) | (indices >= width))
    if len(outside):
        at = int(outside[0])
        raise DataError(f"{source}: node {_row_of(indptr, at)} has feature index {int(indices[at])}, outside the "
                        f"declared width of {width} features (valid indices 0..{width - 1}; {len(outside)} such "
                        "entries in all)")
    bad = np.flatnonzero(~np.isfinite(data))
    if len(bad):
        at = int(bad[0])
        raise DataError(f"{source}: feature {int(indices[at])} of node {_row_of(indptr, at)} is {data[at]}; features "
                        f"must be finite numbers ({len(bad)} non-finite values in all)")


def _row_of(indptr: np.ndarray, position: int) -> int:
    """The CSR row holding stored entry ``position``."""
    return int(np.searchsorted(indptr, position, side="right")) - 1


def _array_reconstructor() -> Any:
    """numpy's ``_reconstruct`` (``numpy.core`` in numpy 1, ``numpy._core`` in numpy 2), found without importing
    a deprecated module path."""
    return np.zeros(1).__reduce__()[0]


_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _array_reconstructor(),
    ("numpy._core.multiarray", "_reconstruct"): _array_reconstructor(),
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("scipy.sparse.csr", "csr_matrix"): CsrRecord,
    ("scipy.sparse._csr", "csr_matrix"): CsrRecord,
    ("collections", "defaultdict"): collections.defaultdict,
    ("__builtin__", "list"): list,
    ("builtins", "list"): list,
}


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals a Planetoid file needs (see the module docstring)."""

    def __init__(self, file: io.BufferedIOBase, source: Path) -> None:
        super().__init__(file, encoding="latin1")  # the files are Python 2 pickles of byte strings
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise DataError(f"{self.source}: refusing to unpickle the global {module}.{name}: a Planetoid file may "
                            "only hold numpy arrays, scipy CSR matrices and a dict of neighbour lists (unpickling "
                            "other globals could run arbitrary code); convert trusted files with "
                            "interlayer.data.planetoid.save_npz")
        return allowed


def safe_unpickle(path: PathLike) -> Any:
    """One of the publisher's Planetoid pickles (``ind.cora.x`` ...), read with :class:`SafeUnpickler`, which builds
    only the array types these files hold (never runs code); anything else is a :class:`DataError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        with path.open("rb") as handle:
            return SafeUnpickler(handle, path).load()
    except DataError:
        raise
    except Exception as err:  # a truncated or foreign file fails in many ways; all mean "not a Planetoid pickle"
        raise DataError(f"{path}: not a readable Planetoid pickle ({type(err).__name__}: {err})") from None


@dataclass
class PlanetoidGraph:
    """A node-classification graph: sparse features, labels (-1: unlabelled), undirected edges, fixed splits."""

    name: str
    feat_data: np.ndarray  # CSR feature matrix (float32 values, int64 indices and row pointers)
    feat_indices: np.ndarray
    feat_indptr: np.ndarray
    feat_shape: tuple[int, int]
    labels: np.ndarray  # (N,) int64
    edges: np.ndarray  # (2, E) int64, source row 0, target row 1; both directions, no self-loops, sorted
    train: np.ndarray  # node ids, int64
    valid: np.ndarray
    test: np.ndarray
    declared_classes: Optional[int] = None  # the classes the file declares (module docstring); None: inferred

    @property
    def num_nodes(self) -> int:
        return self.feat_shape[0]

    @property
    def num_features(self) -> int:
        return self.feat_shape[1]

    @property
    def num_classes(self) -> int:
        return self.declared_classes if self.declared_classes is not None else int(self.labels.max()) + 1

    @property
    def num_edges(self) -> int:
        return self.edges.shape[1]

    def features(self, normalize: bool = True) -> Tensor:
        """Sparse COO ``(N, F)`` feature tensor; ``normalize`` divides each row by its sum (GAT's and Kipf's
        ``preprocess_features``; all-zero rows, Citeseer's isolated nodes, stay zero)."""
        values = self.feat_data.astype(np.float32)
        rows = np.repeat(np.arange(self.num_nodes), np.diff(self.feat_indptr))
        if normalize:
            row_sum = np.bincount(rows, weights=values, minlength=self.num_nodes).astype(np.float32)
            scale = np.divide(1.0, row_sum, out=np.zeros_like(row_sum), where=row_sum != 0)  # Kipf: 1/0 -> 0
            values = values * scale[rows]
        index = torch.from_numpy(np.stack([rows, self.feat_indices]))
        matrix = torch.sparse_coo_tensor(index, torch.from_numpy(values), self.feat_shape, check_invariants=True)
        return matrix.coalesce()


# -- raw files ----------------------------------------------------------------------------------------------------
def _dense_rows(obj: Any, path: Path, what: str) -> np.ndarray:
    if not isinstance(obj, np.ndarray) or obj.ndim != 2:
        raise DataError(f"{path}: expected a 2-D numpy array of {what}, got {type(obj).__name__}")
    return obj


def _one_hot_labels(matrix: np.ndarray, path: Path) -> np.ndarray:
    """Class ids from one-hot rows; an all-zero row means unlabelled (-1). Other rows are errors."""
    sums = matrix.sum(axis=1)
    bad = np.flatnonzero(~(((matrix == 0) | (matrix == 1)).all(axis=1) & (sums <= 1)))
    if len(bad):
        raise DataError(f"{path}: row {bad[0]} is not a one-hot label ({matrix[bad[0]].tolist()})")
    return np.where(sums == 1, matrix.argmax(axis=1), -1).astype(np.int64)


def _read_test_index(path: Path) -> np.ndarray:
    ids = []
    for number, line in iter_lines(path, max_chars=32):
        text = line.strip()
        if not text.isdigit():
            raise DataError(f"{path}:{number}: expected a node id (a non-negative integer), got {line!r}")
        ids.append(int(text))
    if not ids:
        raise DataError(f"{path}: the file is empty")
    array = np.asarray(ids, dtype=np.int64)
    if len(np.unique(array)) != len(array):
        raise DataError(f"{path}: node ids repeat; every test node must be listed once")
    return array


def _edges_from_dict(graph: Any, num_nodes: int, path: Path) -> np.ndarray:
    if not isinstance(graph, dict):
        raise DataError(f"{path}: expected a dict of neighbour lists, got {type(graph).__name__}")
    pairs = []
    for node, neighbours in graph.items():
        if not isinstance(neighbours, list):
            raise DataError(f"{path}: node {node!r} has {type(neighbours).__name__} neighbours, expected a list")
        for other in [node, *neighbours]:
            if not isinstance(other, (int, np.integer)) or not 0 <= other < num_nodes:
                raise DataError(f"{path}: node id {other!r} (neighbour list of {node!r}) is not in 0..{num_nodes - 1}")
        pairs.extend((node, other) for other in neighbours)
    return undirected_edges(np.asarray(pairs, dtype=np.int64).reshape(-1, 2).T, num_nodes)


def undirected_edges(edges: np.ndarray, num_nodes: int) -> np.ndarray:
    """Both directions of every edge, duplicates merged, self-loops removed, sorted by (source, target)."""
    both = np.concatenate([edges, edges[::-1]], axis=1)
    both = both[:, both[0] != both[1]]
    keys = np.unique(both[0] * num_nodes + both[1])
    return np.stack([keys // num_nodes, keys % num_nodes]).astype(np.int64)


def _features(obj: Any, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    if not isinstance(obj, CsrRecord):
        raise DataError(f"{path}: expected a pickled scipy csr_matrix of features, got {type(obj).__name__}")
    return obj.arrays(path)


def _check_sizes(paths: dict[str, Path], shapes: dict[str, tuple[int, int]], labels: dict[str, np.ndarray],
                 widths: dict[str, int], test_index: np.ndarray, valid_size: int) -> None:
    """The files must describe one graph: matching row counts, feature widths, and room for the splits."""
    expectations = [("y", len(labels["y"]), shapes["x"][0], "rows of x"),
                    ("ally", len(labels["ally"]), shapes["allx"][0], "rows of allx"),
                    ("ty", len(labels["ty"]), shapes["tx"][0], "rows of tx"),
                    ("test.index", len(test_index), shapes["tx"][0], "rows of tx"),
                    ("tx", shapes["tx"][1], shapes["allx"][1], "feature columns of allx"),
                    ("ty", widths["ty"], widths["ally"], "classes (one-hot columns) in ally"),
                    ("y", widths["y"], widths["ally"], "classes (one-hot columns) in ally")]
    for part, got, expected, what in expectations:
        if got != expected:
            raise DataError(f"{paths[part]}: has {got} entries but there are {expected} {what}")
    n_all = shapes["allx"][0]
    if test_index.min() < n_all:
        raise DataError(f"{paths['test.index']}: test node {test_index.min()} lies among the allx nodes "
                        f"(0..{n_all - 1}); test nodes must come after them")
    if shapes["x"][0] + valid_size > n_all:
        raise DataError(f"{paths['allx']}: {n_all} nodes cannot hold the {shapes['x'][0]} training nodes of "
                        f"{paths['x']} and {valid_size} validation nodes after them")


def read_raw(prefix: PathLike, valid_size: int = 500) -> PlanetoidGraph:
    """Assemble a graph from ``PREFIX.{x,y,tx,ty,allx,ally,graph,test.index}`` (e.g. ``DIR/ind.cora``); the
    ``valid_size`` nodes after the training nodes validate (500 in every Planetoid loader)."""
    prefix = Path(prefix)
    paths = {part: prefix.with_name(f"{prefix.name}.{part}") for part in (*RAW_PARTS, "test.index")}
    feats = {part: _features(safe_unpickle(paths[part]), paths[part]) for part in ("x", "tx", "allx")}
    one_hot = {part: _dense_rows(safe_unpickle(paths[part]), paths[part], "one-hot labels")
               for part in ("y", "ty", "ally")}
    labels = {part: _one_hot_labels(matrix, paths[part]) for part, matrix in one_hot.items()}
    widths = {part: matrix.shape[1] for part, matrix in one_hot.items()}
    test_index = _read_test_index(paths["test.index"])
    _check_sizes(paths, {part: value[3] for part, value in feats.items()}, labels, widths, test_index, valid_size)
    num_nodes, n_all, n_train = int(test_index.max()) + 1, len(labels["ally"]), len(labels["y"])
    node_labels = np.full(num_nodes, -1, dtype=np.int64)
    node_labels[:n_all] = labels["ally"]
    node_labels[test_index] = labels["ty"]
    train, valid = np.arange(n_train), np.arange(n_train, n_train + valid_size)
    test = np.sort(test_index)
    if (node_labels[np.concatenate([train, valid, test])] < 0).any():
        raise DataError(f"{prefix}: a training, validation or test node has no label (an all-zero row in "
                        f"{paths['ally'].name} or {paths['ty'].name})")
    edges = _edges_from_dict(safe_unpickle(paths["graph"]), num_nodes, paths["graph"])
    return PlanetoidGraph(prefix.name.removeprefix("ind."),
                          *_assemble_features(feats["allx"], feats["tx"], test_index, num_nodes), node_labels,
                          edges, train, valid, test, declared_classes=widths["ally"])


def _assemble_features(allx: tuple, tx: tuple, test_index: np.ndarray, num_nodes: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """CSR rows: allx for nodes 0..len(allx)-1, tx row k for node test_index[k], empty rows elsewhere."""
    n_all, n_feat = allx[3]
    source_of = np.full(num_nodes, -1, dtype=np.int64)
    source_of[:n_all] = np.arange(n_all)
    source_of[test_index] = n_all + np.arange(len(test_index))
    data = np.concatenate([allx[0], tx[0]])
    indices = np.concatenate([allx[1], tx[1]])
    indptr = np.concatenate([allx[2], tx[2][1:] + allx[2][-1]])
    present = source_of >= 0
    lengths = np.where(present, np.diff(indptr)[np.maximum(source_of, 0)], 0)
    new_indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    shift = indptr[source_of[present]] - new_indptr[:-1][present]  # new position -> old position, per row
    order = np.arange(new_indptr[-1]) + np.repeat(shift, lengths[present])
    return data[order], indices[order], new_indptr, (num_nodes, n_feat)


# -- npz files ----------------------------------------------------------------------------------------------------
def save_npz(graph: PlanetoidGraph, path: PathLike) -> Path:
    """Write ``graph`` as a compressed ``.npz`` that :func:`load_npz` reads without pickle."""
    path = Path(path)
    np.savez_compressed(path, name=np.asarray(graph.name), feat_data=graph.feat_data,
                        feat_indices=graph.feat_indices.astype(np.int32),
                        feat_indptr=graph.feat_indptr.astype(np.int32),
                        feat_shape=np.asarray(graph.feat_shape, dtype=np.int64),
                        labels=graph.labels.astype(np.int32), edges=graph.edges.astype(np.int32),
                        train=graph.train.astype(np.int32), valid=graph.valid.astype(np.int32),
                        test=graph.test.astype(np.int32), num_classes=np.asarray(graph.num_classes, dtype=np.int64))
    return path


def load_npz(path: PathLike) -> PlanetoidGraph:
    """A graph from interlayer's ``.npz`` form (:func:`save_npz`; the bundled Cora and Citeseer), read without pickles,
    its arrays checked against one another (:func:`_check_graph`)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [k for k in NPZ_KEYS if k not in archive.files]
            if missing:
                raise DataError(f"{path}: missing arrays {missing}; expected {list(NPZ_KEYS)} (write the file with "
                                "interlayer.data.planetoid.save_npz)")
            arrays = {k: archive[k] for k in NPZ_KEYS}
            declared = int(archive[CLASSES_KEY]) if CLASSES_KEY in archive.files else None
    except (OSError, ValueError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{path}: not a readable .npz file ({err})") from None
    shape = tuple(int(n) for n in arrays["feat_shape"])
    graph = PlanetoidGraph(str(arrays["name"]), arrays["feat_data"].astype(np.float32),
                           arrays["feat_indices"].astype(np.int64), arrays["feat_indptr"].astype(np.int64), shape,
                           arrays["labels"].astype(np.int64), arrays["edges"].astype(np.int64),
                           *(arrays[k].astype(np.int64) for k in ("train", "valid", "test")), declared_classes=declared)
    _check_graph(graph, path)
    return graph


def _check_labels(graph: PlanetoidGraph, source: Path) -> None:
    """Labels are -1 (no label) or a class id below the declared ``num_classes``; without a declaration the
    classes are ``0..max(label)`` and each must have a node, so that one stray label (50 among 0..6) is an error
    instead of a model with 51 classes, 44 of them never seen."""
    labels = graph.labels
    if len(labels) == 0 or labels.max() < 0:
        raise DataError(f"{source}: no node has a label")
    if graph.declared_classes is not None:
        if graph.declared_classes < 2:
            raise DataError(f"{source}: {CLASSES_KEY}={graph.declared_classes}; a classification needs at least 2")
        bad = np.flatnonzero((labels < -1) | (labels >= graph.declared_classes))
        if len(bad):
            raise DataError(f"{source}: node {bad[0]} has label {labels[bad[0]]}, outside the declared "
                            f"{CLASSES_KEY}={graph.declared_classes} (valid: 0..{graph.declared_classes - 1}, or -1 "
                            f"for no label; {len(bad)} such nodes)")
        return
    if labels.min() < -1:
        node = int(np.argmin(labels))
        raise DataError(f"{source}: node {node} has label {labels[node]}; labels are class ids >= 0, or -1 for none")
    missing = sorted(set(range(int(labels.max()) + 1)) - set(labels[labels >= 0].tolist()))
    if missing:
        node = int(np.argmax(labels))
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise DataError(f"{source}: the labels run to {labels.max()} (node {node}) but no node has class {shown}: "
                        f"with no declared {CLASSES_KEY} the classes are 0..{labels.max()}, each needing nodes; fix "
                        f"the label, or declare the classes (save_npz writes {CLASSES_KEY})")


def _check_graph(graph: PlanetoidGraph, source: Path) -> None:
    n = graph.num_nodes
    if graph.feat_indptr.shape != (n + 1,) or graph.feat_indptr[-1] != len(graph.feat_data):
        raise DataError(f"{source}: feature row pointers do not match the feature values")
    if len(graph.labels) != n:
        raise DataError(f"{source}: {len(graph.labels)} labels for {n} nodes")
    problems = []
    if graph.edges.ndim != 2 or graph.edges.shape[0] != 2 or (graph.num_edges and not
                                                               (0 <= graph.edges.min() and graph.edges.max() < n)):
        problems.append("edges must be a (2, E) array of node ids")
    for split in ("train", "valid", "test"):
        ids = getattr(graph, split)
        if len(ids) == 0 or ids.min() < 0 or ids.max() >= n or (graph.labels[ids] < 0).any():
            problems.append(f"the {split} split names nodes outside 0..{n - 1} or without a label")
    if problems:
        raise DataError(f"{source}: {'; '.join(problems)}")
    check_features(graph.feat_data, graph.feat_indices, graph.feat_indptr, graph.feat_shape, source)
    _check_labels(graph, source)


# -- either format ------------------------------------------------------------------------------------------------
def load_planetoid(source: str) -> PlanetoidGraph:
    """A ``.npz`` file (see :func:`save_npz`) or a raw prefix ``DIR/ind.NAME``; ``bundled:`` paths allowed."""
    path = resolve_path(source)
    if path.suffix == ".npz":
        return load_npz(path)
    if not path.with_name(f"{path.name}.graph").is_file():
        raise DataError(f"{source}: neither a .npz file nor the prefix of raw Planetoid files ({path}.graph does "
                        "not exist); pass e.g. data/planetoid/ind.cora or a .npz written by save_npz")
    return read_raw(path)
