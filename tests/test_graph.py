"""Planetoid data (safe unpickling, assembly, bundled splits), GAT (masked attention, sparse = dense, MAdds,
checkpoints), its Crossformer adaptations (ties, counts, changed outputs) and the cora/citeseer tasks."""
from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from interlayer import create_model, get_config
from interlayer.accounting import count_madds, count_parameters
from interlayer.checkpoint import save_pretrained, tie_map
from interlayer.cli import main
from interlayer.core.config import ConfigError
from interlayer.data.planetoid import PlanetoidGraph, load_npz, load_planetoid, read_raw, safe_unpickle, save_npz
from interlayer.data.text import DataError
from interlayer.experiment import train
from interlayer.models.gat import GAT, SHARING, GATConfig, GATLayer, with_self_loops
from interlayer.models.registry import load_pretrained
from interlayer.papers.crossformer import GAT_PRESETS
from interlayer.tasks import task_specs
from interlayer.tasks.graph import NodeClassificationTask
from interlayer.training import state_file
from interlayer.training.engine import LAST

SHARED_RAW = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid"  # beside the checkout
OPTIONS = list(SHARING)


def tiny_config(**overrides) -> GATConfig:
    return GATConfig(**{**dict(in_features=5, num_classes=3, hidden=4, heads=2), **overrides})


def path_graph(n: int) -> torch.Tensor:
    """0 - 1 - 2 - ... - (n-1), both directions."""
    a = torch.arange(n - 1)
    return torch.cat([torch.stack([a, a + 1]), torch.stack([a + 1, a])], dim=1)


# -- data ----------------------------------------------------------------------------------------------------------
def test_safe_unpickler_refuses_a_forbidden_global(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    path = tmp_path / "ind.evil.x"
    path.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(DataError, match=r"ind\.evil\.x: refusing to unpickle the global \w+\.system"):
        safe_unpickle(path)
    with pytest.raises(DataError, match="refusing"):
        read_raw(tmp_path / "ind.evil")
    assert not marker.exists()


def test_safe_unpickler_reports_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "ind.cut.y"
    path.write_bytes(pickle.dumps(np.eye(3), protocol=4)[:40])
    with pytest.raises(DataError, match=r"ind\.cut\.y: not a readable Planetoid pickle"):
        safe_unpickle(path)


def _fake_csr_class(monkeypatch: pytest.MonkeyPatch) -> type:
    """A class that pickles under scipy's name (``scipy.sparse.csr.csr_matrix``) with scipy's CSR attributes."""
    module = types.ModuleType("scipy.sparse.csr")

    class csr_matrix:  # noqa: N801 - the name scipy's matrices are pickled under
        def __init__(self, dense: np.ndarray) -> None:
            self.format, self._shape, self.maxprint = "csr", dense.shape, 50
            self.indptr = np.concatenate([[0], np.cumsum((dense != 0).sum(1))]).astype(np.int32)
            self.indices = np.nonzero(dense)[1].astype(np.int32)
            self.data = dense[dense != 0].astype(np.float32)

    csr_matrix.__module__, csr_matrix.__qualname__ = "scipy.sparse.csr", "csr_matrix"
    module.csr_matrix = csr_matrix
    for name in ("scipy", "scipy.sparse"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "scipy.sparse.csr", module)
    return csr_matrix


def write_raw(directory: Path, csr: type, test_index: str = "7\n5\n8\n") -> Path:
    """Nodes 0-4 in allx (0, 1 train), test nodes 7, 5, 8 (file order), node 6 missing (Citeseer's case)."""
    rng = np.random.default_rng(0)
    eye = np.eye(3)
    allx = (rng.random((5, 4)) < 0.5).astype(np.float32) + np.eye(5, 4, dtype=np.float32)
    tx = np.array([[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 1, 1]], dtype=np.float32)
    parts = {"x": csr(allx[:2]), "y": eye[[0, 1]], "allx": csr(allx), "ally": eye[[0, 1, 2, 0, 1]],
             "tx": csr(tx), "ty": eye[[2, 1, 0]],
             "graph": collections.defaultdict(list, {0: [1, 2], 1: [0], 2: [0, 2], 3: [4, 4], 4: [3], 5: [7],
                                                     6: [], 7: [5, 8], 8: []})}
    for part, obj in parts.items():
        (directory / f"ind.toy.{part}").write_bytes(pickle.dumps(obj, protocol=4))
    (directory / "ind.toy.test.index").write_text(test_index)
    return directory / "ind.toy"


def test_raw_files_are_assembled_like_kipf_and_pyg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = read_raw(write_raw(tmp_path, _fake_csr_class(monkeypatch)), valid_size=2)
    features = graph.features(normalize=False).to_dense()
    assert graph.num_nodes == 9 and graph.num_features == 4 and graph.num_classes == 3
    assert features[7].tolist() == [1, 0, 0, 1] and features[5].tolist() == [0, 1, 1, 0]  # tx row k -> index[k]
    assert features[6].abs().sum() == 0 and graph.labels[6] == -1  # the missing test-range node: zeros, no label
    assert graph.labels.tolist() == [0, 1, 2, 0, 1, 1, -1, 2, 0]
    assert graph.train.tolist() == [0, 1] and graph.valid.tolist() == [2, 3] and graph.test.tolist() == [5, 7, 8]
    pairs = set(map(tuple, graph.edges.T.tolist()))
    assert pairs == {(0, 1), (1, 0), (0, 2), (2, 0), (3, 4), (4, 3), (5, 7), (7, 5), (7, 8), (8, 7)}
    assert graph.num_edges == len(pairs)  # symmetric, no duplicates, no self-loops
    assert torch.allclose(graph.features().to_dense().sum(1)[[0, 5, 7]], torch.ones(3))  # rows normalised


def test_a_malformed_test_index_names_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = write_raw(tmp_path, _fake_csr_class(monkeypatch), test_index="7\nx5\n8\n")
    with pytest.raises(DataError, match=r"ind\.toy\.test\.index:2: expected a node id"):
        read_raw(prefix, valid_size=2)


@pytest.mark.parametrize("name, nodes, features, classes, edges, train_size",
                         [("cora", 2708, 1433, 7, 10556, 140), ("citeseer", 3327, 3703, 6, 9104, 120)])
def test_bundled_graphs_have_the_planetoid_splits(name, nodes, features, classes, edges, train_size) -> None:
    graph = load_planetoid(f"bundled:planetoid/{name}.npz")
    assert (graph.num_nodes, graph.num_features, graph.num_classes, graph.num_edges) == (nodes, features, classes,
                                                                                         edges)
    assert (len(graph.train), len(graph.valid), len(graph.test)) == (train_size, 500, 1000)
    assert np.bincount(graph.labels[graph.train]).tolist() == [20] * classes
    assert len(np.intersect1d(graph.train, graph.valid)) == len(np.intersect1d(graph.valid, graph.test)) == 0
    reverse = set(map(tuple, graph.edges[::-1].T.tolist()))
    assert reverse == set(map(tuple, graph.edges.T.tolist())) and (graph.edges[0] != graph.edges[1]).all()
    unlabelled = np.flatnonzero(graph.labels < 0)
    assert len(unlabelled) == (15 if name == "citeseer" else 0)  # Citeseer's isolated nodes, zero features
    assert np.diff(graph.feat_indptr)[unlabelled].sum() == 0


@pytest.mark.skipif(not SHARED_RAW.is_dir(), reason="the publisher's raw Planetoid files are not on this machine")
@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_bundled_npz_equals_the_raw_files(name: str) -> None:
    raw, bundled = read_raw(SHARED_RAW / f"ind.{name}"), load_planetoid(f"bundled:planetoid/{name}.npz")
    for key in ("feat_data", "feat_indices", "feat_indptr", "labels", "edges", "train", "valid", "test"):
        assert np.array_equal(getattr(raw, key), getattr(bundled, key)), key


def test_a_broken_npz_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "g.npz"
    np.savez(path, labels=np.zeros(3))
    with pytest.raises(DataError, match=r"g\.npz: missing arrays"):
        load_planetoid(str(path))
    with pytest.raises(DataError, match="neither a .npz file nor the prefix"):
        load_planetoid(str(tmp_path / "ind.nothing"))


# -- the reader's checks of a graph file (issue 16) ----------------------------------------------------------
def _toy_graph(**changes) -> PlanetoidGraph:
    """Six nodes, two classes, features 0..3."""
    base = dict(name="toy", feat_data=np.ones(6, dtype=np.float32), feat_indices=np.array([0, 1, 2, 3, 0, 1]),
                feat_indptr=np.arange(7), feat_shape=(6, 4), labels=np.array([0, 1, 0, 1, 0, 1]),
                edges=np.array([[0, 1], [1, 0]]), train=np.array([0, 1]), valid=np.array([2, 3]),
                test=np.array([4, 5]))
    return PlanetoidGraph(**{**base, **changes})


@pytest.mark.parametrize("changes, message", [
    ({"feat_data": np.array([1, 1, np.nan, 1, 1, 1], dtype=np.float32)},
     r"feature 2 of node 2 is nan; features must be finite"),
    ({"feat_indices": np.array([0, 1, 2, 7, 0, 1])},
     r"node 3 has feature index 7, outside the declared width of 4 features \(valid indices 0\.\.3"),
    ({"labels": np.array([0, 1, 0, 1, 0, 50])}, r"the labels run to 50 \(node 5\) but no node has class 2, 3, .*"),
    ({"labels": np.array([0, 1, 0, 1, 0, 50]), "declared_classes": 7},
     r"node 5 has label 50, outside the declared num_classes=7"),
    ({"feat_indptr": np.array([0, 1, 3, 2, 4, 5, 6])},  # issue 29: an IndexError before
     r"feat_indptr falls at node 2 \(3 -> 2\); the offsets must never decrease \(1 such nodes in all\)"),
])
def test_the_graph_reader_refuses_bad_features_and_labels(tmp_path, changes, message):
    path = save_npz(_toy_graph(**changes), tmp_path / "toy.npz")
    if "declared_classes" not in changes:  # a file as written before num_classes existed
        with np.load(path) as archive:
            arrays = {k: archive[k] for k in archive.files if k != "num_classes"}
        np.savez_compressed(path, **arrays)
    with pytest.raises(DataError, match=rf"toy\.npz: {message}"):
        load_npz(path)


def test_declared_classes_survive_the_npz_round_trip(tmp_path):
    graph = load_planetoid("bundled:planetoid/cora.npz")
    assert graph.declared_classes is None and graph.num_classes == 7  # inferred, every class present
    again = load_npz(save_npz(graph, tmp_path / "cora.npz"))
    assert again.declared_classes == 7


def test_train_on_a_graph_with_a_nan_feature_exits_2(tmp_path, capsys):
    path = save_npz(_toy_graph(feat_data=np.array([1, 1, 1, np.inf, 1, 1], dtype=np.float32)), tmp_path / "g.npz")
    assert main(["train", "cora", "--graph", str(path), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "feature 3 of node 3 is inf" in capsys.readouterr().err



# -- GAT -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["sparse", "dense"])
def test_attention_is_masked_to_neighbours(impl: str) -> None:
    layer = GATLayer(5, 4, 2, concat=True, negative_slope=0.2, attn_dropout=0.0, attn_impl=impl).eval()
    edges = with_self_loops(path_graph(5), 5)
    x = torch.randn(5, 5)
    base = layer(x, edges)
    far, near = x.clone(), x.clone()
    far[2] += 3.0  # node 2 is not a neighbour of node 0
    near[1] += 3.0
    assert torch.allclose(layer(far, edges)[0], base[0])
    assert not torch.allclose(layer(near, edges)[0], base[0])
    model = GAT(tiny_config(attn_impl=impl)).eval()  # two layers: node 0 sees two hops
    logits = model(x, path_graph(5)).logits
    three_hops, two_hops = x.clone(), x.clone()
    three_hops[3] += 3.0
    two_hops[2] += 3.0
    assert torch.allclose(model(three_hops, path_graph(5)).logits[0], logits[0])
    assert not torch.allclose(model(two_hops, path_graph(5)).logits[0], logits[0])


def test_self_loops_are_added_once() -> None:
    edges = torch.tensor([[0, 1, 1, 2, 0], [1, 0, 1, 1, 1]])  # holds the self-loop 1 -> 1 and 0 -> 1 twice
    looped = with_self_loops(edges, 3)
    assert sorted(map(tuple, looped.T.tolist())) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 1), (2, 2)]
    with pytest.raises(ValueError, match="outside 0..2"):
        with_self_loops(torch.tensor([[0], [3]]), 3)


@pytest.mark.parametrize("crossformer", [None, "kq", "ffn"])
def test_sparse_and_dense_attention_agree(crossformer) -> None:
    sparse = GAT(tiny_config(crossformer=crossformer, out_heads=2, dropout=0.0, attn_dropout=0.0))
    dense = GAT(tiny_config(crossformer=crossformer, out_heads=2, dropout=0.0, attn_dropout=0.0, attn_impl="dense"))
    dense.load_state_dict(sparse.state_dict())
    x, edges = torch.randn(7, 5), torch.randint(0, 7, (2, 30))  # with repeats and self-loops
    assert torch.allclose(sparse(x, edges).logits, dense(x, edges).logits, atol=1e-6)
    assert torch.allclose(sparse(x.to_sparse(), edges).logits, sparse(x, edges).logits, atol=1e-6)


@pytest.mark.parametrize("crossformer", [None, *OPTIONS])
def test_madds_match_the_flop_counter(crossformer) -> None:
    """On a complete graph the dense path computes exactly the edges the sparse count covers (E + N = N^2)."""
    n = 6
    model = GAT(tiny_config(crossformer=crossformer, out_heads=2, attn_impl="dense")).eval()
    pairs = torch.cartesian_prod(torch.arange(n), torch.arange(n)).T
    edges = pairs[:, pairs[0] != pairs[1]]
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(n, 5), edges)
    assert counter.get_total_flops() == 2 * count_madds(model, n, edges.shape[1])


def test_madds_need_the_edge_count() -> None:
    with pytest.raises(ValueError, match="number of directed edges"):
        count_madds(GAT(tiny_config()), 10)


def test_output_heads_are_averaged() -> None:
    model = GAT(tiny_config(out_heads=3)).eval()
    assert model.layers[1].bias.shape == (3,)
    assert model(torch.randn(4, 5), path_graph(4)).logits.shape == (4, 3)


def test_glorot_bounds_are_per_head() -> None:
    layer = GATLayer(1433, 8, 8, concat=True, negative_slope=0.2, attn_dropout=0.6)
    assert layer.weight.abs().max() <= (6 / (1433 + 8)) ** 0.5
    assert layer.weight.abs().max() > 0.9 * (6 / (1433 + 8)) ** 0.5
    assert layer.att_src.abs().max() <= (6 / 9) ** 0.5 and layer.bias.abs().sum() == 0


def test_official_dropout_masks_each_head_and_drops_the_values() -> None:
    """Isolated nodes, one input feature equal to 1: each head's output is its own dropped copy of ``W x``."""
    def outputs(placement: str) -> torch.Tensor:
        torch.manual_seed(0)
        layer = GATLayer(1, 8, 4, concat=True, negative_slope=0.2, dropout=0.5,
                         official_dropout=placement == "official").train()
        out = layer(torch.ones(50, 1), with_self_loops(torch.zeros(2, 0, dtype=torch.long), 50))
        return out.view(50, 4, 8) / layer.weight.view(4, 8)  # 0 or 1/(1-p) per entry
    paper, official = outputs("paper"), outputs("official")
    assert (paper == paper[:, :1, :1]).all()  # one mask per node, shared by heads and features
    assert not (official == official[:, :, :1]).all()  # features dropped one by one (values)
    assert not (official[:, :, 0] == official[:, :1, 0]).all()  # heads differ (input masks per head)
    assert set(official.unique().tolist()) == {0.0, 4.0}  # two dropouts of p = 0.5 in a row


def test_dropout_acts_only_in_training() -> None:
    for placement in ("paper", "official"):
        model = GAT(tiny_config(dropout_placement=placement))
        x, edges = torch.randn(6, 5), path_graph(6)
        assert not torch.allclose(model(x, edges).logits, model(x, edges).logits)
        reference = GAT(tiny_config()).eval()
        reference.load_state_dict(model.state_dict())
        model.eval()
        assert torch.equal(model(x, edges).logits, reference(x, edges).logits)  # the placements agree in eval


# -- Crossformer on GAT --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, plain, kq, ffn", [("cora", 92_373, 92_366, 92_359),
                                                  ("citeseer", 237_586, 237_580, 237_574)])
def test_parameter_counts(name: str, plain: int, kq: int, ffn: int) -> None:
    assert count_parameters(create_model(f"gat_{name}")) == plain  # PyG's GAT on Cora has 92,373 too
    assert count_parameters(create_model(f"gat_{name}_crossformer_kq")) == kq
    assert count_parameters(create_model(f"gat_{name}_crossformer_ffn")) == ffn


@pytest.mark.parametrize("option", OPTIONS)
def test_crossformer_ties_layer_two_vectors_to_layer_one(option: str) -> None:
    model = GAT(tiny_config(crossformer=option))
    lower, upper = model.layers
    for role, source in SHARING[option].items():
        assert getattr(upper, f"att_{role}") is getattr(lower, f"att_{source}")
    for role in {"dst", "src"} - set(SHARING[option]):
        assert getattr(upper, f"att_{role}").shape == (1, 3)  # its own, on the projected class scores
    assert len(tie_map(model)) == len(SHARING[option])
    assert count_parameters(GAT(tiny_config())) - count_parameters(model) == 3 * len(SHARING[option])


# This project's adaptation (Crossformer Sec. 3.3 / App. A.3 give no GAT details; models/gat.py docstring),
# written out: option -> {layer-2 attention vector: the layer-1 vector it is}. a_dst scores the target node (GAT's
# query term), a_src the source node (its key term); a role not listed keeps layer 2's own vector.
GAT_MAPPING = {"kq": {"att_dst": "att_src"}, "qk": {"att_src": "att_dst"}, "qq": {"att_dst": "att_dst"},
               "kk": {"att_src": "att_src"}, "ffn": {"att_dst": "att_dst", "att_src": "att_src"}}


@pytest.mark.parametrize("option", list(GAT_MAPPING))
def test_crossformer_on_gat_shares_exactly_the_documented_vectors(option: str) -> None:
    """Which layer-1 parameter each layer-2 parameter is, and what layer 2 computes with it: a borrowed vector
    (layer 1's 8 x 8 heads x features, read head-major as one vector) scores layer 2's *input*, its own vectors
    score its projected features W2 h (GAT Eq. 1-3), written out here on a dense graph."""
    model = GAT(tiny_config(crossformer=option)).eval()
    lower, upper = model.layers
    borrowed = {name: next((other for other, q in lower.named_parameters() if q is p), None)
                for name, p in upper.named_parameters()}
    assert borrowed == {"weight": None, "bias": None, "att_dst": None, "att_src": None, **GAT_MAPPING[option]}

    h = torch.randn(6, 8)  # layer 2's input: layer 1's 2 heads x 4 features
    edges = with_self_loops(path_graph(6), 6)
    projected = h @ upper.weight  # (N, C), one output head
    scores = {}
    for role in ("att_dst", "att_src"):
        if role in GAT_MAPPING[option]:
            scores[role] = h @ getattr(lower, GAT_MAPPING[option][role]).reshape(-1)
        else:
            scores[role] = projected @ getattr(upper, role)[0]
    logits = torch.nn.functional.leaky_relu(scores["att_dst"][:, None] + scores["att_src"][None, :], 0.2)
    adjacency = torch.zeros(6, 6, dtype=torch.bool)
    adjacency[edges[1], edges[0]] = True  # row i attends to its neighbours j and itself (Eq. 2)
    alpha = torch.softmax(logits.masked_fill(~adjacency, torch.finfo(logits.dtype).min), dim=-1)
    torch.testing.assert_close(upper(h, edges), alpha @ projected + upper.bias)


def test_crossformer_presets_say_they_are_our_adaptation() -> None:
    guided = {name: description for name, (description, fields) in GAT_PRESETS.items() if fields.get("crossformer")}
    assert len(guided) == 4
    assert all("this project's adaptation (the paper gives no GAT details)" in d for d in guided.values())


@pytest.mark.parametrize("option", OPTIONS)
def test_crossformer_changes_the_function(option: str) -> None:
    """Same weights wherever the shapes agree: only the guided scoring differs, so the outputs must."""
    plain, guided = GAT(tiny_config()).eval(), GAT(tiny_config(crossformer=option)).eval()
    own = guided.state_dict()  # a tied tensor under its first name only (core/hub.py track_ties)
    guided.load_state_dict({k: v for k, v in plain.state_dict().items() if k in own and own[k].shape == v.shape},
                           strict=False)
    x, edges = torch.randn(6, 5), path_graph(6)
    assert not torch.allclose(plain(x, edges).logits, guided(x, edges).logits)


@pytest.mark.parametrize("option", OPTIONS)
def test_layer_two_scores_its_input_with_the_shared_vector(option: str) -> None:
    model = GAT(tiny_config(crossformer=option))
    shared = next(iter(SHARING[option].items()))
    vector = getattr(model.layers[0], f"att_{shared[1]}")
    h = torch.randn(6, 8)  # layer two's input, taken apart from layer one
    out = model.layers[1](h, with_self_loops(path_graph(6), 6))
    (grad,) = torch.autograd.grad(out.square().sum(), vector)
    assert grad.abs().sum() > 0


def test_save_and_load_keep_the_ties(tmp_path: Path) -> None:
    model = GAT(tiny_config(crossformer="kq")).eval()
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m").eval()
    assert isinstance(loaded, GAT) and loaded.config == model.config
    assert loaded.layers[1].att_dst is loaded.layers[0].att_src
    x, edges = torch.randn(6, 5), path_graph(6)
    assert torch.equal(loaded(x, edges).logits, model(x, edges).logits)


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"crossformer='kv' is not valid; choose one of 'kq'"):
        get_config("gat_cora", crossformer="kv")
    with pytest.raises(ConfigError, match=r"unknown key 'head' \(did you mean 'heads'\?\)"):
        get_config("gat_cora", head=4)
    with pytest.raises(ConfigError, match=r"attn_dropout=1.0 must lie in \[0, 1\)"):
        get_config("gat_cora", attn_dropout=1.0)
    with pytest.raises(ConfigError, match="unknown preset 'gat_pubmed'"):
        get_config("gat_pubmed")
    create_model("gat_cora", crossformer="ffn").config.save(tmp_path / "c.yaml")
    assert get_config(tmp_path / "c.yaml").crossformer == "ffn"
    assert set(GAT_PRESETS) >= {"gat_cora", "gat_citeseer_crossformer_kq"}


# -- tasks ---------------------------------------------------------------------------------------------------------
def test_gat_early_stopping_rule() -> None:
    """Patience resets when accuracy >= its best or loss <= its lowest, each best kept apart (ties count)."""
    rule = NodeClassificationTask.is_improvement
    best = {"accuracy": 80.0, "nll": 0.50}
    assert rule({"accuracy": 80.0, "nll": 0.9}, dict(best))  # accuracy tie
    step = {"accuracy": 81.0, "nll": 0.60}
    assert rule(step, dict(best)) and (step["best_accuracy"], step["best_nll"]) == (81.0, 0.50)
    assert not rule({"accuracy": 79.0, "nll": 0.55}, step)  # better than step's own loss, not the lowest (0.50)
    assert rule({"accuracy": 70.0, "nll": 0.49}, step)


def test_smoke_training_and_evaluate(tmp_path: Path) -> None:
    spec = task_specs()["citeseer"]
    results = train(spec, preset="gat_citeseer_crossformer_kq", sets={"train.max_epochs": "3"}, seed=3,
                    run_dir=tmp_path / "run", progress=False)
    assert results["status"] == "finished" and results["epochs"] == 3 and results["test_nodes"] == 1000
    assert results["parameters"] == 237_580 and 0.0 <= results["test_accuracy"] <= 100.0
    assert json.loads((tmp_path / "run" / "best" / "task.json").read_text())["task"] == "citeseer"
    state = state_file.read(tmp_path / "run" / LAST)["state"]
    assert state["best_epoch"] == 1 or "best_nll" in state["best_metrics"]
    text = spec.evaluate(tmp_path / "run" / "best", argparse.Namespace(data=None))
    assert "1000 test nodes, accuracy" in text and "| gold 5 |" in text and "recall" in text
    with pytest.raises(ConfigError, match="cora.npz has 1433 features and 7 classes, but the model expects 3703 and 6"):
        spec.evaluate(tmp_path / "run" / "best", argparse.Namespace(data="bundled:planetoid/cora.npz"))


def test_tasks_are_registered_with_gat_defaults() -> None:
    specs = task_specs()
    for name in ("cora", "citeseer"):
        defaults = specs[name].train_defaults
        assert specs[name].default_preset == f"gat_{name}"
        assert (defaults["lr"], defaults["weight_decay"], defaults["patience"], defaults["schedule"]) == (
            0.005, 5e-4, 100, "constant")
