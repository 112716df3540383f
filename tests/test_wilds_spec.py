"""datasets.yaml is data: a wrong entry is one line naming the file, the key and what was expected."""
from __future__ import annotations

import copy

import pytest
import yaml

from raybench.data.wilds.spec import SPEC_FILE, SpecError, load_specs

SHIPPED = yaml.safe_load(SPEC_FILE.read_text())


def test_the_shipped_file_describes_the_eight_datasets():
    specs = load_specs()
    assert sorted(specs) == ["amazon", "camelyon17", "civilcomments", "fmow", "globalwheat", "iwildcam",
                             "ogb-molpcba", "poverty"]
    assert specs["camelyon17"].defaults.max_batch_size == 168 and specs["camelyon17"].defaults.replicates == 10
    assert specs["ogb-molpcba"].defaults.lr_center == 1e-2
    assert specs["civilcomments"].defaults.balance_labeled_by == "y"


def _broken(edit) -> dict:
    data = copy.deepcopy(SHIPPED)
    edit(data["camelyon17"])
    return data


@pytest.mark.parametrize("edit, key, expected", [
    (lambda d: d.pop("selection"), "camelyon17.selection", "a value (required)"),
    (lambda d: d.update(tasks=1), "camelyon17.tasks", "one of task"),
    (lambda d: d["task"].update(kind="segmentation"), "camelyon17.task.kind", "one of classification"),
    (lambda d: d["task"].update(n_outputs=0), "camelyon17.task.n_outputs", "a positive integer"),
    (lambda d: d.update(inputs="audio"), "camelyon17.inputs", "one of image"),
    (lambda d: d.update(input_shape=[3, -96]), "camelyon17.input_shape", "a list of positive integers"),
    (lambda d: d["defaults"].update(learning_rate=1), "camelyon17.defaults.learning_rate", "one of model"),
    (lambda d: d["search"].update(max_batch_size=0), "camelyon17.search.max_batch_size", "a positive integer"),
    (lambda d: d["search"].update(lr_center=-1), "camelyon17.search.lr_center", "a positive number"),
    (lambda d: d.update(balance_labeled_by="label"), "camelyon17.balance_labeled_by", "one of y, domain, group"),
])
def test_a_wrong_entry_names_file_key_and_expectation(edit, key, expected, tmp_path):
    path = tmp_path / "datasets.yaml"
    path.write_text(yaml.safe_dump(_broken(edit)))
    with pytest.raises(SpecError) as err:
        load_specs(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {key}: expected {expected}") and "\n" not in message
