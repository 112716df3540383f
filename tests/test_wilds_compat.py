"""Each patch of raybench/data/wilds/compat.py on its own (the fixture tests exercise them end to end)."""
from __future__ import annotations

import pickle
import sys

import pandas as pd
import pytest
import torch

from raybench.data.wilds import compat

compat.apply()


def test_torch_scatter_stand_in_matches_a_hand_computed_group_mean():
    import torch_scatter
    from wilds.common.utils import avg_over_groups

    v = torch.tensor([1.0, 3.0, 10.0, 2.0, 4.0])
    g = torch.tensor([0, 0, 2, 3, 3])
    means, counts = avg_over_groups(v, g, n_groups=5)  # wilds' own function, as its eval calls it
    assert means.tolist() == [2.0, 0.0, 10.0, 3.0, 0.0]  # empty groups are 0, as in torch_scatter
    assert counts.tolist() == [2, 0, 1, 2, 0]
    rows = torch_scatter.scatter(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), torch.tensor([1, 0, 1]),
                                 dim=0, dim_size=3, reduce="sum")
    assert rows.tolist() == [[3.0, 4.0], [6.0, 8.0], [0.0, 0.0]]
    assert "raybench" in sys.modules["torch_scatter"].__doc__


def test_civilcomments_reads_its_split_column_as_objects_under_pandas_3(tmp_path):
    from wilds.datasets import civilcomments_dataset

    path = tmp_path / "c.csv"
    pd.DataFrame({"comment_text": ["a", "b"], "split": ["train", "val"]}).to_csv(path)
    frame = civilcomments_dataset.pd.read_csv(path, index_col=0)
    assert frame["split"].dtype == object and isinstance(frame["comment_text"].dtype, pd.StringDtype)
    frame.loc[frame["split"] == "train", "split"] = 0  # what wilds does next; a str column would refuse an int
    assert frame["split"].tolist() == [0, "val"]


def test_ogb_loads_its_own_processed_graphs_with_weights_only_false(tmp_path):
    from ogb.graphproppred import dataset_pyg
    from torch_geometric.data import Data

    path = tmp_path / "graphs.pt"
    torch.save((Data(x=torch.zeros(2, 9, dtype=torch.long)), {"x": torch.tensor([0, 2])}), path)
    with pytest.raises(pickle.UnpicklingError):  # plain torch >= 2.6 refuses PyG objects by default
        torch.load(path)
    data, slices = dataset_pyg.torch.load(path)
    assert data.x.shape == (2, 9) and slices["x"].tolist() == [0, 2]


def test_pyg_collater_works_without_a_dataset():
    from torch_geometric.data import Data
    from wilds.datasets import ogbmolpcba_dataset

    collate = ogbmolpcba_dataset.PyGCollater(follow_batch=[], exclude_keys=[])
    batch = collate([Data(x=torch.zeros(2, 9), edge_index=torch.tensor([[0], [1]])),
                     Data(x=torch.ones(3, 9), edge_index=torch.tensor([[0], [2]]))])
    assert batch.num_graphs == 2 and batch.x.shape == (5, 9)


def test_transformers_adamw_is_torchs():
    compat.apply()  # as every raybench entry point into wilds does (after other tests loaded models)
    from transformers import AdamW

    assert AdamW is torch.optim.AdamW


def test_ogb_never_downloads_or_prompts_and_prepare_restores_it(tmp_path):
    from ogb.graphproppred import dataset_pyg

    with pytest.raises(compat.MissingDataError, match="raybench data prepare"):
        dataset_pyg.decide_download("https://example.invalid/x.zip")
    with pytest.raises(compat.MissingDataError, match="RELEASE_v1.txt"):
        dataset_pyg.input("Will you update the dataset now? (y/N)\n")
    with compat.downloads_allowed():
        assert not hasattr(dataset_pyg, "input")  # the builtin prompt again, only inside `data prepare`
        assert dataset_pyg.decide_download.__module__ == "ogb.utils.url"
    with pytest.raises(compat.MissingDataError):
        dataset_pyg.download_url("https://example.invalid/x.zip", str(tmp_path))


def test_apply_is_idempotent():
    before = sys.modules["torch_scatter"]
    compat.apply()
    assert sys.modules["torch_scatter"] is before
