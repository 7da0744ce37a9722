"""Graph Attention Networks (Veličković et al., ICLR 2018) and their Crossformer adaptations (Crossformer Sec. 3.3,
Table 5, Appendix A.3).

GAT, as the paper defines it (equation numbers of the GAT paper):

* A layer projects every node with a shared ``W`` and scores each edge ``j -> i`` with a single-layer feedforward
  network ``a`` and LeakyReLU(0.2): ``e_ij = LeakyReLU(a^T [W h_i || W h_j])`` (Eq. 1, 3), i.e. with ``a`` split into
  its target half ``a_dst`` and source half ``a_src``: ``e_ij = LeakyReLU(a_dst . W h_i + a_src . W h_j)``.
* **Masked attention**: the softmax runs over ``j`` in the neighbourhood of ``i`` *including ``i`` itself* (Eq. 2);
  the model adds exactly one self-loop per node (existing ones are dropped first, repeated edges merged).
* ``K`` independent heads; hidden layers concatenate them after the nonlinearity (Eq. 5), the output layer
  averages them (Eq. 6) and leaves the softmax to the loss.
* Transductive model (Sec. 3.3): 2 layers; layer 1 has ``K = 8`` heads of ``F' = 8`` features and ELU; layer 2 has
  one head (``out_heads = 1``, Cora/Citeseer) computing ``C`` class scores; dropout ``p = 0.6`` on *both layers'
  inputs* and on the normalised attention coefficients; Glorot initialisation. (L2 5e-4, Adam lr 0.005 and the
  early stopping are training settings: :mod:`interlayer.tasks.graph`.)

Implementation notes:

* ``attn_impl="sparse"`` (default) works on the edge list: scores per edge, a softmax per target node with
  ``index_add_``, aggregation per edge: O(|V| F F' + |E| F') per head, the complexity the GAT paper states
  (Sec. 2.2). ``attn_impl="dense"`` is the official TensorFlow formulation (an N x N logit matrix per head with the
  non-edges masked before the softmax, then ``alpha @ W h``); it gives the same outputs and exists to check the
  sparse path and the MAdds with ``torch.utils.flop_counter``.
* Per-head Glorot bounds ``sqrt(6 / (F + F'))`` as in the official code (one ``conv1d`` per head); the attention
  vectors as its ``F' -> 1`` kernels, ``sqrt(6 / (F' + 1))``; biases (added after aggregation, per head in
  hidden layers and after the head average in the output layer, as the official code and PyG) start at zero.
  The official code also gives the two scoring ``conv1d`` a bias each; Eq. 1 has none, so neither do we.
* Input features may be a sparse COO tensor (bag-of-words are ~1% dense); dropout then acts on the stored values,
  which has the distribution of dropout on the dense matrix (its zeros stay zero either way).
* ``dropout_placement="paper"`` (default) drops each layer's input (one mask for all heads) and the coefficients,
  as Sec. 3.3 says. ``"official"`` follows the reference code that produced the paper's numbers
  (``utils/layers.py``, ``attn_head``): every head draws its own input mask, and the projected features ``W h`` are
  dropped again (same p) after the scores are computed, before aggregation. Training costs about twice as much.

Crossformer on GAT: this project's adaptation, not the paper's specification. The paper (Sec. 3.3, App. A.3)
applies "Crossformer-Key-Query" and "Crossformer-FFN" hard guidance to the two-layer GAT above and reports only
accuracies (Table 5). It gives no GAT details: not what is shared, nor how, and the Transformer recipe cannot be
copied: GAT has no query/key/FFN matrices, and its two layers have no weight of equal shape (Cora: ``W1`` 1433 x 64,
``a1`` 8 heads x 8 per half; ``W2`` 64 x 7, ``a2`` 1 x 7). The mapping (``SHARING``; layer 2's vector = layer 1's):
``kq``: ``a_dst2 = a_src1``; ``qk``: ``a_src2 = a_dst1``; ``qq``: ``a_dst2 = a_dst1``; ``kk``: ``a_src2 = a_src1``;
``ffn``: ``a_dst2 = a_dst1`` and ``a_src2 = a_src1``; ``W`` and the biases are never shared. The reasons:

* **What a GAT "query" and "key" are.** The score splits into a query term of the target node, ``q_i = a_dst . W
  h_i``, and a key term of the source node, ``k_j = a_src . W h_j``: ``a_dst`` and ``a_src`` are GAT's query and
  key parameters (``W`` is shared by query, key and value, so it belongs to neither).
* **Where layers meet.** Layer 1's attention vectors act on its projected features ``W1 x``, the 64-dimensional
  space (8 heads x 8 features) that layer 1 outputs and layer 2 reads. So layer 1's key vector ``a_src1`` (8 x 8)
  read as one 64-vector is a linear functional on layer 2's input, and can serve as layer 2's query: ``q2_i =
  a_src1 . h_i`` where ``h`` is layer 2's input (layer 1's ELU'd, dropped-out output). That is Crossformer Eq. 3,
  ``K(t) = Q(t+1)``, made exact by sharing the parameter (the project's crossformer module makes the same "weight
  tying" reading for Transformers: the literal state equality is circular), applied to the same feature
  coordinates on both sides. Layer 2 then has no ``a_dst`` of its own; with several output heads all heads share
  this query (their keys stay their own).
* ``crossformer="kq"`` (Crossformer-Key-Query, Eq. 3): layer 2's query vector *is* layer 1's key vector, as above.
  ``"qk"``, ``"qq"``, ``"kk"`` are the other orders of the paper's Table 6 ablation: the first letter names layer
  1's vector, the second the role it plays in layer 2 (``"qk"``: layer 1's query vector is layer 2's key vector).
* ``crossformer="ffn"`` (Crossformer-FFN, Eq. 5): GAT has no position-wise FFN. Its only feedforward networks are
  the node transform ``W`` and the attention mechanism ``a``, which the GAT paper itself calls "a single-layer
  feedforward neural network, parametrized by a weight vector a" (Sec. 2.1). ``W`` cannot be tied: ``W1`` maps the
  1433 input words into the 64-d hidden space, ``W2`` maps that space to the 7 classes, and any tie between them
  would equate an arbitrary sub-block (input word ``f`` -> hidden unit ``c`` with hidden unit ``f`` -> class ``c``).
  So Crossformer-FFN ties the feedforward attention network: layer 2's whole ``a = [a_dst || a_src]`` is layer 1's,
  role for role, as Eq. 5 ties the same matrix (``W_2``) in adjacent layers, whereas key-query ties a key to a query.
  It therefore shares both halves ("qq" and "kk" at once) and saves twice what "kq" saves.
* **Savings.** Only layer 2's own attention vectors disappear: ``out_heads * C`` parameters for each shared half
  (Cora: 7 for kq, 14 for ffn, out of 92,373; Citeseer: 6 / 12 of 237,586). GAT's attention has 142 parameters in
  all; the paper gives no GAT parameter counts, only that hard guidance uses less memory, which holds.
  Scoring on the 64-d input instead of the 7-d projection costs ``N * 64`` instead of ``N * 7`` MAdds per shared
  half, which :meth:`GAT.madds` counts.

The presets of Crossformer Table 5's rows for Cora and Citeseer are in :mod:`interlayer.papers.crossformer`;
``interlayer.create_model("gat_cora", crossformer="kq")`` builds them with overrides. The data decides ``in_features``
and ``num_classes`` (the task sets them).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..accounting import count_madds
from ..config_io import ConfigFile, MethodSlots, checked_config
from ..core.hub import PretrainedMixin, track_ties
from ..data.planetoid import load_planetoid
from ..errors import ConfigError
from .registry import Family, override_flat, register_family

MODEL_TYPE = "gat"
# crossformer option -> {role in layer 2: the layer-1 attention vector it is}; "dst" is the query, "src" the key
SHARING: dict[str, dict[str, str]] = {
    "kq": {"dst": "src"},
    "qk": {"src": "dst"},
    "qq": {"dst": "dst"},
    "kk": {"src": "src"},
    "ffn": {"dst": "dst", "src": "src"},
}


@dataclass
class GATConfig(ConfigFile):
    """The two-layer transductive GAT (Sec. 3.3 of the GAT paper); defaults are its Cora model."""

    # sizes of the saved tensors (checkpoint.py)
    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"in_features", "num_classes", "hidden", "heads", "out_heads"})

    model_type: Literal["gat"] = MODEL_TYPE
    in_features: int = 1433  # decided by the data
    num_classes: int = 7  # decided by the data
    hidden: int = 8  # F' of layer 1, per head
    heads: int = 8  # K of layer 1 (concatenated)
    out_heads: int = 1  # K of layer 2 (averaged); the paper uses 8 only on Pubmed
    dropout: float = 0.6  # on both layers' inputs
    attn_dropout: float = 0.6  # on the normalised attention coefficients
    negative_slope: float = 0.2  # LeakyReLU of Eq. 1
    dropout_placement: Literal["paper", "official"] = "paper"  # module docstring
    crossformer: Optional[Literal["kq", "qk", "qq", "kk", "ffn"]] = None  # our hard-guidance adaptation (docstring)
    attn_impl: Literal["sparse", "dense"] = "sparse"

    def validate(self) -> None:
        """The ranges; the choice fields are checked by their ``Literal`` types when the config is read."""
        for key in ("in_features", "hidden", "heads", "out_heads"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}={getattr(self, key)} must be a positive integer")
        if self.num_classes < 2:
            raise ConfigError(f"num_classes={self.num_classes} must be at least 2")
        for key in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"{key}={getattr(self, key)} must lie in [0, 1) (GAT uses 0.6)")
        if not self.negative_slope >= 0.0:
            raise ConfigError(f"negative_slope={self.negative_slope} must be >= 0 (GAT's LeakyReLU uses 0.2)")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "gat config") -> "GATConfig":
        """Checked like every interlayer config: unknown keys and wrong types raise, naming the key."""
        return checked_config(cls, data, source)


@dataclass
class GATOutput:
    """Shaped like :class:`~interlayer.core.models.ClassifierOutput`, so ``core.losses.total_loss`` applies."""

    logits: Tensor  # (N, num_classes), every node of the graph
    exit_logits: Optional[list[Tensor]] = None
    aux_losses: dict[str, Tensor] = dataclasses.field(default_factory=dict)


def with_self_loops(edge_index: Tensor, num_nodes: int) -> Tensor:
    """``edge_index`` (2, E) of ``source -> target`` edges as a set (duplicates merged: a neighbourhood is a set of
    nodes) with its self-loops replaced by one per node (Eq. 2: a node attends to itself)."""
    if edge_index.dim() != 2 or edge_index.shape[0] != 2 or edge_index.dtype != torch.long:
        raise ValueError(f"edge_index must be a (2, E) long tensor, got {tuple(edge_index.shape)} "
                         f"{edge_index.dtype}")
    if edge_index.numel() and not (0 <= int(edge_index.min()) and int(edge_index.max()) < num_nodes):
        raise ValueError(f"edge_index holds node ids outside 0..{num_nodes - 1}")
    keys = edge_index[0] * num_nodes + edge_index[1]
    if not bool((keys[1:] > keys[:-1]).all()):  # sorted and repeat-free (the Planetoid loader's order) skips the sort
        keys = torch.unique(keys)
    source, target = keys // num_nodes, keys % num_nodes
    keep = source != target
    loops = torch.arange(num_nodes, device=edge_index.device)
    return torch.stack([torch.cat([source[keep], loops]), torch.cat([target[keep], loops])])


def feature_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout of a dense or sparse COO matrix (for a sparse one, of its stored values: the zeros stay zero)."""
    if not training or p == 0.0:
        return x
    if x.is_sparse:
        x = x.coalesce()
        return torch.sparse_coo_tensor(x.indices(), F.dropout(x.values(), p, True), x.shape, is_coalesced=True,
                                       check_invariants=False)  # the indices of a coalesced tensor, unchanged
    return F.dropout(x, p, True)


def _matmul(x: Tensor, w: Tensor) -> Tensor:
    return torch.sparse.mm(x, w) if x.is_sparse else x @ w


def _glorot_(tensor: Tensor, fan_in: int, fan_out: int) -> None:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(tensor, -bound, bound)


class GATLayer(nn.Module):
    """One graph attentional layer with ``heads`` heads of ``out_features`` each (Eq. 1-6), with its input dropout.

    ``shared`` maps a role (``"dst"``: query, ``"src"``: key) to a parameter borrowed from the layer below
    (Crossformer hard guidance). A borrowed vector has ``in_features`` entries and scores this layer's *input*,
    the space it came from (module docstring); the layer's own vectors score its projected features.
    ``official_dropout`` draws an input mask per head and also drops the projected features before aggregation.
    """

    def __init__(self, in_features: int, out_features: int, heads: int, *, concat: bool, negative_slope: float,
                 dropout: float = 0.0, attn_dropout: float = 0.0, official_dropout: bool = False,
                 attn_impl: str = "sparse", shared: Optional[dict[str, nn.Parameter]] = None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.heads = in_features, out_features, heads
        self.concat, self.negative_slope, self.attn_impl = concat, negative_slope, attn_impl
        self.dropout, self.attn_dropout, self.official_dropout = dropout, attn_dropout, official_dropout
        self.weight = nn.Parameter(torch.empty(in_features, heads * out_features))
        for head in range(heads):
            _glorot_(self.weight.data[:, head * out_features:(head + 1) * out_features], in_features, out_features)
        shared = shared or {}
        for role in ("dst", "src"):
            if role in shared:
                if shared[role].numel() != in_features:
                    raise ValueError(f"a shared attention vector must have {in_features} entries (this layer's "
                                     f"input width), got {shared[role].numel()}")
                setattr(self, f"att_{role}", shared[role])
            else:
                vector = nn.Parameter(torch.empty(heads, out_features))
                _glorot_(vector.data, out_features, 1)
                setattr(self, f"att_{role}", vector)
        self.on_input = {role: role in shared for role in ("dst", "src")}
        self.bias = nn.Parameter(torch.zeros(heads * out_features if concat else out_features))

    def _inputs(self, x: Tensor) -> list[Tensor]:
        """The input as each head sees it: one dropout mask for all heads, or one per head (official code)."""
        if self.official_dropout and self.training and self.dropout > 0.0:
            return [feature_dropout(x, self.dropout, True) for _ in range(self.heads)]
        return [feature_dropout(x, self.dropout, self.training)]

    def _project(self, inputs: list[Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """``W h`` as (N, heads, out_features) and the borrowed vectors' scores of the input, (N, heads) each."""
        weights = self.weight.chunk(len(inputs), dim=1)
        projected = torch.cat([_matmul(x, w) for x, w in zip(inputs, weights)], dim=1)
        scores = {role: torch.cat([_matmul(x, getattr(self, f"att_{role}").reshape(-1, 1)) for x in inputs],
                                  dim=1).expand(-1, self.heads)
                  for role in ("dst", "src") if self.on_input[role]}
        return projected.view(-1, self.heads, self.out_features), scores

    def forward(self, x: Tensor, edges: Tensor) -> Tensor:
        """``x`` (N, in_features) dense or sparse COO; ``edges`` (2, E) ``source -> target`` *with* self-loops.
        Returns (N, heads * out_features) if ``concat`` else the head mean (N, out_features), bias added."""
        h, scores = self._project(self._inputs(x))
        query, key = (scores[role] if role in scores else torch.einsum("nkf,kf->nk", h, getattr(self, f"att_{role}"))
                      for role in ("dst", "src"))  # Eq. 1: a_dst . W h_i and a_src . W h_j
        if self.official_dropout:
            h = F.dropout(h, self.dropout, self.training)
        aggregate = self._sparse_attention if self.attn_impl == "sparse" else self._dense_attention
        out = aggregate(h, query, key, edges)  # (N, heads, out_features)
        out = out.reshape(out.shape[0], -1) if self.concat else out.mean(dim=1)
        return out + self.bias

    def _sparse_attention(self, h: Tensor, query: Tensor, key: Tensor, edges: Tensor) -> Tensor:
        source, target = edges[0], edges[1]
        logits = F.leaky_relu(query[target] + key[source], self.negative_slope)  # (E, heads), Eq. 3
        with torch.no_grad():  # the per-target maximum only stabilises exp(); the softmax does not depend on it
            peak = torch.full_like(query, -math.inf).scatter_reduce_(0, target[:, None].expand_as(logits), logits,
                                                                      "amax")
        weights = torch.exp(logits - peak[target])
        totals = torch.zeros_like(query).index_add_(0, target, weights)
        alpha = F.dropout(weights / totals[target], self.attn_dropout, self.training)  # Eq. 2 over N_i, dropped
        messages = alpha.unsqueeze(-1) * h[source]
        return torch.zeros_like(h).index_add_(0, target, messages)

    def _dense_attention(self, h: Tensor, query: Tensor, key: Tensor, edges: Tensor) -> Tensor:
        n = h.shape[0]
        adjacency = torch.zeros(n, n, dtype=torch.bool, device=h.device)
        adjacency[edges[1], edges[0]] = True  # row: target i, column: source j
        logits = F.leaky_relu(query.t().unsqueeze(2) + key.t().unsqueeze(1), self.negative_slope)  # (heads, N, N)
        logits = logits.masked_fill(~adjacency, torch.finfo(logits.dtype).min)
        alpha = F.dropout(torch.softmax(logits, dim=-1), self.attn_dropout, self.training)
        return torch.bmm(alpha, h.transpose(0, 1)).transpose(0, 1)

    def madds(self, num_nodes: int, num_edges: int) -> int:
        """Projection ``N F K F'``, the two score terms (``N K F'`` each, or ``N F`` for a borrowed vector scoring
        the input) and aggregation ``E K F'`` over the ``num_edges`` edges including self-loops."""
        width = self.heads * self.out_features
        scores = sum(num_nodes * (self.in_features if self.on_input[role] else width) for role in ("dst", "src"))
        return num_nodes * self.in_features * width + scores + num_edges * width


class GAT(nn.Module, PretrainedMixin):
    """Two GAT layers: ``heads`` x ``hidden`` concatenated + ELU, then ``out_heads`` averaged class scores."""

    model_type = MODEL_TYPE

    def __init__(self, cfg: GATConfig) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        common = dict(negative_slope=cfg.negative_slope, dropout=cfg.dropout, attn_dropout=cfg.attn_dropout,
                      official_dropout=cfg.dropout_placement == "official", attn_impl=cfg.attn_impl)
        first = GATLayer(cfg.in_features, cfg.hidden, cfg.heads, concat=True, **common)
        shared = {role: getattr(first, f"att_{lower}")
                  for role, lower in SHARING.get(cfg.crossformer or "", {}).items()}
        second = GATLayer(cfg.heads * cfg.hidden, cfg.num_classes, cfg.out_heads, concat=False, shared=shared,
                          **common)
        self.layers = nn.ModuleList([first, second])
        track_ties(self)  # each tied tensor once in state dicts

    def forward(self, x: Tensor, edge_index: Tensor, *, self_loops: bool = False) -> GATOutput:
        """``x`` (N, in_features), dense or sparse COO; ``edge_index`` (2, E) long, ``source -> target`` (both
        directions for an undirected graph). Self-loops are added here, unless ``self_loops`` says ``edge_index``
        already went through :func:`with_self_loops`: a caller that runs one graph many times (the graph task)
        does that once, because merging duplicates depends on the edges' values (a host synchronisation and a
        graph break under ``torch.compile`` at every call). Returns class scores of every node."""
        edges = edge_index if self_loops else with_self_loops(edge_index, x.shape[0])
        hidden = F.elu(self.layers[0](x, edges))
        return GATOutput(logits=self.layers[1](hidden, edges))

    def madds(self, num_nodes: int, num_edges: Optional[int] = None) -> int:
        """Multiply-adds of one forward pass over a graph of ``num_nodes`` nodes and ``num_edges`` directed edges
        *without* self-loops (the model adds ``num_nodes``); what ``count_madds(model, N, E)`` calls.

        Input features count as dense (the GAT paper's O(|V| F F') per head), although a sparse input does less.
        """
        if num_edges is None:
            raise ValueError("GAT's cost depends on the graph: pass the number of directed edges, e.g. "
                             "count_madds(model, graph.num_nodes, graph.num_edges)")
        total_edges = num_edges + num_nodes
        return sum(layer.madds(num_nodes, total_edges) for layer in self.layers)


@functools.lru_cache(maxsize=None)
def _graph_size(dataset: str) -> tuple[int, int]:
    """Nodes and directed edges of a bundled Planetoid graph, read once per process."""
    graph = load_planetoid(f"bundled:planetoid/{dataset}.npz")
    return graph.num_nodes, graph.num_edges


def _graph_madds(name: str, model: nn.Module, length: int) -> int:
    """Over the bundled graph the preset is made for (``gat_cora...`` -> Cora, ``gat_citeseer...`` -> Citeseer)."""
    return count_madds(model, *_graph_size("cora" if name.startswith("gat_cora") else "citeseer"))


register_family(Family(
    name=MODEL_TYPE, title="GAT", tasks="cora, citeseer", config_class=GATConfig, from_dict=GATConfig.from_dict,
    override=override_flat, build=GAT, madds=_graph_madds, madds_unit="MAdds per pass over the graph", rank=3,
    model_types=(MODEL_TYPE,), claims=lambda data: data.get("model_type") == MODEL_TYPE,
    method_slots=MethodSlots("GAT", at=None, forms={"crossformer": "hard_pair"})))
