"""GIN with a virtual node for ogb-molpcba (Hu et al., 2020; WILDS' `gin-virtual`), on PyTorch Geometric.

Input: a `torch_geometric.data.Batch` of molecules with OGB features (`x` long [N, 9] atom features,
`edge_attr` long [E, 3] bond features, `edge_index`, `batch`). Each of the 5 layers

    h <- h + v[batch]                                   (virtual node -> atoms)
    h' = BN(MLP((1 + eps) h + sum_j relu(h_j + bond_l(e_ij))))   (PyG's GINEConv, eps trained)
    h' = dropout(relu(h'))      (no ReLU after the last layer)
    v <- dropout(MLP_v(sum_atoms h + v))                (atoms -> virtual node; not after the last layer)

with width 300, MLPs 300 -> 600 -> 300 (BatchNorm inside; the virtual-node MLP also ends in BN + ReLU),
dropout 0.5, the virtual node starting at 0 in every graph. The featurizer mean-pools atoms into one
300-d vector per graph; the head is Linear(300, n_outputs) (128 tasks on molpcba). Facts from WILDS'
examples/models/gnn.py (itself OGB's GNN_node_Virtualnode with GIN); the code is our own.

torch_geometric and ogb are imported when a model is built, not when raybench.models is imported
(together they take several seconds to import).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from raybench.models.base import FeaturizerHead, load_local_weights
from raybench.models.registry import MODELS, ModelSpec

if TYPE_CHECKING:
    from torch_geometric.data import Batch

EMBEDDING_DIM = 300
N_LAYERS = 5
DROPOUT = 0.5


def _encoders() -> tuple[type[nn.Module], type[nn.Module]]:
    """ogb's AtomEncoder and BondEncoder (sums of one embedding per OGB feature column).

    Importing ogb starts a thread that asks PyPI for a newer ogb; offline that can hold the process
    open for seconds at exit, so the check is disabled first (the one compat patch ogb's import needs).
    """
    from raybench.data.wilds import compat

    compat.silence_ogb_version_check()
    from ogb.graphproppred.mol_encoder import AtomEncoder, BondEncoder

    return AtomEncoder, BondEncoder


def _mlp(width: int, final_norm: bool) -> nn.Sequential:
    """width -> 2 width -> width with BatchNorm + ReLU in between (and at the end when `final_norm`)."""
    layers: list[nn.Module] = [nn.Linear(width, 2 * width), nn.BatchNorm1d(2 * width), nn.ReLU(), nn.Linear(2 * width, width)]
    if final_norm:
        layers += [nn.BatchNorm1d(width), nn.ReLU()]
    return nn.Sequential(*layers)


def _sum_per_graph(h: Tensor, batch: Tensor, n_graphs: int) -> Tensor:
    return h.new_zeros(n_graphs, h.shape[1]).index_add_(0, batch, h)


class GINLayer(nn.Module):
    """One GINE convolution with its own bond embedding (OGB embeds bonds afresh in every layer)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        from torch_geometric.nn import GINEConv

        _, BondEncoder = _encoders()
        self.bond_encoder = BondEncoder(emb_dim=width)
        self.conv = GINEConv(_mlp(width, final_norm=False), eps=0.0, train_eps=True)

    def forward(self, h: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        return self.conv(h, edge_index, self.bond_encoder(edge_attr))


class GINVirtualFeaturizer(nn.Module):
    """Molecular graphs -> one `width`-dim vector per graph (mean of the last layer's atom embeddings)."""

    def __init__(self, width: int = EMBEDDING_DIM, n_layers: int = N_LAYERS, dropout: float = DROPOUT) -> None:
        super().__init__()
        if n_layers < 2:
            raise ValueError(f"a GIN with a virtual node needs at least 2 layers, got n_layers={n_layers}")
        AtomEncoder, _ = _encoders()
        self.width, self.dropout = width, dropout
        self.atom_encoder = AtomEncoder(emb_dim=width)
        self.virtual_node = nn.Parameter(torch.zeros(width))  # shared start state of every graph's virtual node
        self.layers = nn.ModuleList(GINLayer(width) for _ in range(n_layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(width) for _ in range(n_layers))
        self.virtual_mlps = nn.ModuleList(_mlp(width, final_norm=True) for _ in range(n_layers - 1))

    def forward(self, graphs: Batch) -> Tensor:
        batch = graphs.batch
        n_graphs = int(graphs.num_graphs)
        h = self.atom_encoder(graphs.x)
        virtual = self.virtual_node.expand(n_graphs, -1)
        last = len(self.layers) - 1
        for i, (layer, norm) in enumerate(zip(self.layers, self.norms)):
            h = h + virtual[batch]
            out = norm(layer(h, graphs.edge_index, graphs.edge_attr))
            out = F.dropout(out if i == last else F.relu(out), self.dropout, self.training)
            if i < last:
                # the virtual node reads this layer's input (atoms already carrying the virtual message)
                pooled = _sum_per_graph(h, batch, n_graphs) + virtual
                virtual = F.dropout(self.virtual_mlps[i](pooled), self.dropout, self.training)
            h = out
        counts = torch.bincount(batch, minlength=n_graphs).clamp(min=1).unsqueeze(1).to(h.dtype)
        return _sum_per_graph(h, batch, n_graphs) / counts


@MODELS.register("gin_virtual")
def build_gin_virtual(spec: ModelSpec) -> FeaturizerHead:
    """`spec.input_shape` is not used (graphs vary in size); `spec.weights` is a featurizer state dict."""
    featurizer = GINVirtualFeaturizer()
    load_local_weights(featurizer, spec.weights)
    return FeaturizerHead(featurizer, EMBEDDING_DIM, spec.n_outputs)
