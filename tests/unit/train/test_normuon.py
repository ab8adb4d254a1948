"""NorMuon (train.normuon, kiln.train.muon): off, Muon is torch's (tests/unit/train/test_optimizers.py);
on, each matrix's orthogonalised update leaves with its rows (a wide matrix's columns) at one RMS and
its norm unchanged, the second moment lives in the optimizer state, and a flagged step keeps it."""

from __future__ import annotations

import copy

import pytest
import torch
from synthetic import train_sections

from kiln.config.models import model_config
from kiln.config.train_sections import TrainSection
from kiln.model.build import build_model
from kiln.train.muon import Muon
from kiln.train.optim import build_optimizer, hidden_matrices

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest.py)

MUON = {"optimizer": "muon", "muon_lr": 0.02, "muon_weight_decay": 0.0}


def _llama_and_batch(seed: int = 0):
    torch.manual_seed(seed)
    shape = {"family": "llama", "n_layer": 2, "n_head": 2, "n_kv_head": 1, "d_model": 32}
    return build_model(model_config(shape, 64, 16)), torch.randint(0, 64, (4, 17))


def _backward(m, x) -> None:
    m.zero_grad(set_to_none=True)
    m(x[:, :-1], x[:, 1:])[1].backward()


def test_the_setting_reaches_muon_and_is_off_by_default():
    m, _ = _llama_and_batch()
    assert (
        build_optimizer(m, TrainSection.of(train_sections(**MUON)["train"]), "cpu", bf16=True).parts[0].normuon is False
    )
    on = TrainSection.of(train_sections(**MUON, normuon=True)["train"])
    assert build_optimizer(m, on, "cpu", bf16=True).parts[0].normuon is True


def test_a_normuon_update_has_muons_norm_and_even_rows():
    m, x = _llama_and_batch()
    ref = copy.deepcopy(m)
    ours = Muon(hidden_matrices(m), lr=0.02, momentum=0.95, weight_decay=0.0, normuon=True)
    plain = Muon(hidden_matrices(ref), lr=0.02, momentum=0.95, weight_decay=0.0)
    before = [p.detach().clone() for p in hidden_matrices(m)]
    _backward(m, x), _backward(ref, x)
    ours.step(), plain.step()
    for p, q, b in zip(hidden_matrices(m), hidden_matrices(ref), before):
        step, plain_step = b - p.detach(), b - q.detach()
        assert not torch.allclose(step, plain_step)
        torch.testing.assert_close(step.norm(), plain_step.norm(), rtol=1e-3, atol=0)
        dim = -1 if p.size(0) >= p.size(1) else 0  # each row of a tall matrix, each column of a wide one
        rms = step.square().mean(dim=dim).sqrt()
        torch.testing.assert_close(rms, rms.mean().expand_as(rms), rtol=1e-3, atol=0)
        moment = ours.state[p]["normuon_second_moment"]
        assert moment.shape == ((p.size(0), 1) if dim == -1 else (1, p.size(1)))
    assert all("normuon_second_moment" not in s for s in plain.state.values())


def test_a_flagged_step_keeps_the_second_moment():
    m, x = _llama_and_batch()
    muon = Muon(hidden_matrices(m), lr=0.02, momentum=0.95, weight_decay=0.0, normuon=True)
    _backward(m, x)
    muon.step()
    kept = {id(p): muon.state[p]["normuon_second_moment"].clone() for p in hidden_matrices(m)}
    weights = [p.detach().clone() for p in hidden_matrices(m)]
    _backward(m, x)
    muon.found_inf = torch.ones(())
    muon.step()
    for p, w in zip(hidden_matrices(m), weights):
        assert torch.equal(muon.state[p]["normuon_second_moment"], kept[id(p)]) and torch.equal(p, w)
