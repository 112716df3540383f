"""Noisy Student chained as its authors chain it: each student starts from its teacher's weights, with the dropout
added on top; `student_init=scratch` keeps the fresh initialisation as a named ablation."""
from __future__ import annotations

import pytest
import torch
from test_algorithms import context_for, lenet, round_context
from torch import nn

from raybench.algorithms import build_algorithm
from raybench.trainer import ConfigError, TrainConfig, Trainer


def _as_student_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A plain-headed teacher's keys as the student's Dropout-then-Linear head names them."""
    return {k.replace("head.", "head.1.") if k.startswith("head.") else k: v for k, v in state.items()}


def _student_after_begin_round(dataset, tmp_path, init: str):
    torch.manual_seed(0)
    algorithm = build_algorithm("noisy_student", lenet(dataset), {"teacher_checkpoint": "teacher.pt",
                                                                  "student_init": init}, context_for(dataset))
    context = round_context(dataset, algorithm, tmp_path)
    teacher = context.load_model("teacher.pt", "teacher_checkpoint")
    fresh = {k: v.clone() for k, v in algorithm.model.state_dict().items()}
    facts = algorithm.begin_round(context)
    return algorithm, teacher, fresh, facts


def test_a_student_starts_from_its_teachers_weights_under_its_own_dropout(tiny_dataset, tmp_path):
    algorithm, teacher, fresh, facts = _student_after_begin_round(tiny_dataset, tmp_path, "teacher")
    assert isinstance(algorithm.model.head, nn.Sequential) and isinstance(algorithm.model.head[0], nn.Dropout)
    expected = _as_student_keys(teacher.state_dict())
    student = algorithm.model.state_dict()
    assert student.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(student[key], value), key
    assert any(not torch.equal(fresh[k], v) for k, v in expected.items()), "teacher and fresh student were alike"
    assert facts["round_0/student_init"] == "the teacher's weights"


def test_scratch_is_the_ablation_that_keeps_the_fresh_student(tiny_dataset, tmp_path):
    algorithm, teacher, fresh, facts = _student_after_begin_round(tiny_dataset, tmp_path, "scratch")
    student = algorithm.model.state_dict()
    assert all(torch.equal(student[k], v) for k, v in fresh.items())
    assert not torch.equal(student["head.1.weight"], teacher.state_dict()["head.weight"])
    assert facts["round_0/student_init"] == "a fresh initialisation (student_init=scratch)"


def test_the_second_rounds_student_starts_from_the_first_rounds_best(tiny_dataset, monkeypatch, tmp_path):
    """Through the trainer: round 1's student, when its training begins, holds round 0's best student."""
    seen = {}
    original = Trainer._train_round

    def recording(self, algorithm, optimizer, schedule, generators, last_round):
        if self.progress.round == 1:
            seen["start"] = {k: v.detach().clone() for k, v in algorithm.model.state_dict().items()}
            seen["teacher"] = dict(self.previous_round_state)
        return original(self, algorithm, optimizer, schedule, generators, last_round)

    monkeypatch.setattr(Trainer, "_train_round", recording)
    config = TrainConfig.from_flat({"algorithm": "noisy_student", "epochs": 1, "batch_size": 32,
                                    "max_steps_per_epoch": 2, "teacher_epochs": 1, "iterations": 2,
                                    "stage_cache": str(tmp_path)})
    result = Trainer(config, dataset=tiny_dataset).fit()
    assert result.info["round_1/student_init"] == "the teacher's weights"
    for key, value in seen["teacher"].items():
        assert torch.equal(seen["start"][key], value), key


def test_a_bad_student_init_is_refused():
    with pytest.raises(ConfigError, match=r"student_init: expected one of teacher, scratch, got 'random'"):
        TrainConfig.from_flat({"algorithm": "noisy_student", "student_init": "random"})
