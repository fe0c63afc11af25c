"""Re-planning asks the performance model first (``elastic/replan.py``): a planner that
finds no layout falls back to the user's layout, a planner that fails is a bug, raised."""
import pytest

import minipar.perf.plan as plan
from minipar.config import ConfigError, TrainConfig
from minipar.elastic.replan import layout_for

TINY = TrainConfig(model="tiny", n_layer=2, d_model=16, n_head=4, seq_len=8, batch_size=8,
                   precision="fp64")


def test_no_fitting_plan_falls_back_to_the_users_layout(monkeypatch):
    def nothing_fits(config, world, profile=None):
        raise ConfigError(f"no layout of {world} ranks fits")
    monkeypatch.setattr(plan, "auto_layout", nothing_fits)
    config, how = layout_for(TINY, 2)
    assert how == "your layout, dp rescaled" and config.world_size == 2


def test_a_planner_bug_is_raised_not_hidden(monkeypatch):
    def broken(config, world, profile=None):
        return {}["ranked"]                   # a bug inside the planner: KeyError
    monkeypatch.setattr(plan, "auto_layout", broken)
    with pytest.raises(KeyError, match="ranked"):
        layout_for(TINY, 2)


def test_the_plan_is_used_when_it_finds_a_layout():
    config, how = layout_for(TINY, 2)
    assert how == "plan (performance model)" and config.world_size == 2
