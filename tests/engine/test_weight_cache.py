"""The weight cache (systems/disk_cache.py): a cached build has the drawn weights."""

import os

import pytest
import torch

from systems.models import sparse_model
from systems.models.config import ModelConfig
from systems.models.sparse_model import SparseModel
from tests.helpers import SMALL_MODEL as SMALL


def _weights(m: SparseModel) -> list[torch.Tensor]:
    out = [m.embed, m.lm_head]
    for p in m.layers:
        out += [p[k] for k in sorted(p) if torch.is_tensor(p[k])]
    return out


def _same(a: SparseModel, b: SparseModel) -> bool:
    wa, wb = _weights(a), _weights(b)
    return len(wa) == len(wb) and all(torch.equal(x, y) for x, y in zip(wa, wb))


def test_cached_build_loads_the_drawn_weights(tmp_path, monkeypatch):
    cfg = ModelConfig(**SMALL)
    drawn = SparseModel(cfg)  # cache off: drawn
    monkeypatch.setenv("DHS_WEIGHT_CACHE", str(tmp_path))
    first = SparseModel(cfg)  # drawn and saved
    assert len(list(tmp_path.glob("weights-*.pt"))) == 1
    assert _same(drawn, first)

    draws = []
    real = SparseModel._draw_weights
    monkeypatch.setattr(SparseModel, "_draw_weights", lambda self: draws.append(1) or real(self))
    monkeypatch.setattr(sparse_model, "_source", lambda fn: sparse_model.inspect.getsource(real))
    second = SparseModel(cfg)
    assert draws == [] and _same(drawn, second)

    other = SparseModel(ModelConfig(**{**SMALL, "seed": cfg.seed + 1}))  # other weights: drawn
    assert draws == [1] and not _same(drawn, other)
    assert len(list(tmp_path.glob("weights-*.pt"))) == 2


def test_unreadable_cache_file_is_drawn_over(tmp_path, monkeypatch):
    cfg = ModelConfig(**SMALL)
    drawn = SparseModel(cfg)
    monkeypatch.setenv("DHS_WEIGHT_CACHE", str(tmp_path))
    SparseModel(cfg)
    (path,) = tmp_path.glob("weights-*.pt")
    path.write_bytes(b"not a checkpoint")
    assert _same(drawn, SparseModel(cfg))
    assert not list(tmp_path.glob("*.tmp*"))  # no temporary left behind


def test_a_dead_writers_temporary_goes_and_a_live_writer_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("DHS_WEIGHT_CACHE", str(tmp_path))
    cfg = ModelConfig(**SMALL)
    SparseModel(cfg)
    (path,) = tmp_path.glob("weights-*.pt")
    path.unlink()
    dead = tmp_path / f"{path.stem}.tmp999999999"  # no such process
    dead.write_bytes(b"half a checkpoint")
    SparseModel(cfg)
    assert path.exists() and not dead.exists()

    path.unlink()
    live = tmp_path / f"{path.stem}.tmp{os.getppid()}"  # a live process is writing it
    live.write_bytes(b"being written")
    SparseModel(cfg)
    assert not path.exists() and live.exists()


def test_a_cache_file_is_saved_where_it_and_the_margin_fit(tmp_path, monkeypatch):
    """The disk keeps FREE_MARGIN_BYTES beside a saved file: a file that leaves less is not
    saved (the start goes on), one that leaves more is, however large against the disk."""
    import collections

    from systems import disk_cache

    usage = collections.namedtuple("usage", "total used free")
    state = {"w": torch.zeros(1000, dtype=torch.uint8)}  # 1,000 bytes
    for free, saved in (
        (disk_cache.FREE_MARGIN_BYTES + 999, False),
        (disk_cache.FREE_MARGIN_BYTES + 1000, True),
    ):
        monkeypatch.setattr(disk_cache.shutil, "disk_usage", lambda p, f=free: usage(0, 0, f))
        path = tmp_path / f"weights-{free}.pt"
        disk_cache.save(state, path, "weights")
        assert path.exists() == saved


def test_predrawn_weights_are_what_a_model_loads(tmp_path, monkeypatch, capsys):
    """``python -m systems.models.predraw`` draws a preset into the cache without building a
    model; a model of that preset then loads the file (no draw) and holds the weights it would
    have drawn itself, in its device's dtype. A second predraw finds it cached."""
    from systems.engine.config import compose, model_config_from
    from systems.models.predraw import main

    cfg = model_config_from(compose(["model=tiny"]).model, "cpu")
    drawn = SparseModel(cfg)  # cache off: drawn here
    monkeypatch.setenv("DHS_WEIGHT_CACHE", str(tmp_path))
    assert main(["tiny", "--device", "cpu"]) == 0
    assert "tiny: drawn" in capsys.readouterr().out
    assert len(list(tmp_path.glob("weights-*.pt"))) == 1

    real = SparseModel._draw_weights  # the key names its source
    monkeypatch.setattr(SparseModel, "_draw_weights", lambda self: pytest.fail("drawn again"))
    monkeypatch.setattr(sparse_model, "_source", lambda fn: sparse_model.inspect.getsource(real))
    loaded = SparseModel(cfg)
    assert _same(drawn, loaded)
    assert main(["tiny", "--device", "cpu"]) == 0
    assert "tiny: already cached" in capsys.readouterr().out


def test_predraw_needs_the_cache_directory_and_says_when_it_could_not_save(tmp_path, monkeypatch):
    from systems import disk_cache

    monkeypatch.delenv("DHS_WEIGHT_CACHE", raising=False)
    with pytest.raises(ValueError, match="DHS_WEIGHT_CACHE"):
        sparse_model.predraw(ModelConfig(**SMALL))
    monkeypatch.setenv("DHS_WEIGHT_CACHE", str(tmp_path))
    monkeypatch.setattr(disk_cache, "FREE_MARGIN_BYTES", 10**18)  # no disk is large enough
    with pytest.raises(RuntimeError, match="not saved"):
        sparse_model.predraw(ModelConfig(**SMALL))
