"""Static presets and the spec registry."""
import sys
import types

import pytest

from automdt.agents import registry
from automdt.agents.base import Policy
from automdt.agents.falcon import FalconPolicy
from automdt.agents.heuristic import HeuristicPolicy
from automdt.agents.marlin import MarlinPolicy
from automdt.agents.model_based import ModelBasedPolicy
from automdt.agents.registry import available_policies, make_policy, register_policy
from automdt.agents.static import StaticPolicy, globus_policy, parse_static


def test_static_always_returns_its_triple(obs):
    p = StaticPolicy(3, 7, 2)
    assert p.reset(32) == (3, 7, 2)
    for tput in [(0, 0, 0), (1e9, 1e3, 5e8), (float("nan"), 1, 1)]:
        assert p.act(obs((1, 1, 1), tput, fill=(1.0, 0.0))) == (3, 7, 2)
    assert p.name == "static:3,7,2"


def test_static_is_clipped_to_max_threads(obs):
    p = StaticPolicy(3, 40, 2)
    assert p.reset(16) == (3, 16, 2)
    assert p.act(obs((3, 16, 2), (1, 1, 1), max_threads=16)) == (3, 16, 2)


def test_globus_is_cc4_times_p8():
    p = globus_policy()
    assert p.name == "globus"
    assert p.reset(64) == (4, 32, 4)
    assert p.reset(20) == (4, 20, 4)
    assert globus_policy(concurrency=2, parallelism=3).reset(64) == (2, 6, 2)


@pytest.mark.parametrize("bad", ["static:1,2", "static:1,2,3,4", "static:a,2,3", "static:0,2,3", "static:-1,2,3", "static:"])
def test_static_spec_errors(bad):
    with pytest.raises(ValueError):
        parse_static(bad)
    with pytest.raises(ValueError):
        make_policy(bad, 8)


@pytest.mark.parametrize(
    "spec, cls",
    [("marlin", MarlinPolicy), ("falcon", FalconPolicy), ("heuristic", HeuristicPolicy), ("model", ModelBasedPolicy),
     ("Marlin", MarlinPolicy), (" model ", ModelBasedPolicy), ("jung", ModelBasedPolicy), ("arslan", HeuristicPolicy)],
)
def test_make_policy_names(spec, cls):
    p = make_policy(spec, 12)
    assert isinstance(p, cls)
    assert isinstance(p, Policy)
    r, n, w = p.reset(12, seed=1)
    assert all(1 <= x <= 12 for x in (r, n, w))


def test_make_policy_static_and_globus():
    p = make_policy("static:2, 9,3", 8)
    assert isinstance(p, StaticPolicy) and p.reset(8) == (2, 8, 3)
    assert make_policy("GLOBUS", 64).reset(64) == (4, 32, 4)


def test_make_policy_passes_options():
    p = make_policy("heuristic", 32, rtt_s=0.01, avg_file_size=1 << 20, adaptive=False)
    assert p.rtt_s == 0.01 and p.avg_file_size == 1 << 20 and p.adaptive is False
    assert make_policy("falcon", 8, metric="net").metric == "net"
    with pytest.raises(TypeError):
        make_policy("marlin", 8, no_such_option=1)


def test_unknown_spec_lists_valid_names():
    with pytest.raises(ValueError) as e:
        make_policy("bogus", 8)
    msg = str(e.value)
    assert "\n" not in msg
    for name in ("static:R,N,W", "globus", "marlin", "falcon", "heuristic", "model", "ppo", "oracle"):
        assert name in msg
    assert set(available_policies()) >= {"globus", "marlin", "falcon", "heuristic", "model"}


def test_bad_max_threads():
    with pytest.raises(ValueError):
        make_policy("marlin", 0)


def test_ppo_specs_route_to_load_policy(monkeypatch):
    calls = []
    fake = types.ModuleType("automdt.agents.ppo")

    def load_policy(path, **kw):
        calls.append((path, kw))
        return StaticPolicy(1, 1, 1, name="fake-ppo")

    fake.load_policy = load_policy
    monkeypatch.setitem(sys.modules, "automdt.agents.ppo", fake)
    assert make_policy("ppo", 8).name == "fake-ppo"
    make_policy("ppo:/tmp/My Policy.zip", 8, deterministic=False)
    assert make_policy("/models/agent.ZIP", 8).name == "shield:fake-ppo"  # a file runs under the shield
    assert calls == [("ppo", {}), ("/tmp/My Policy.zip", {"deterministic": False}), ("/models/agent.ZIP", {})]
    with pytest.raises(ValueError):
        make_policy("ppo:", 8)


def test_missing_optional_module_gives_a_clear_error(monkeypatch):
    real = registry.importlib.import_module

    def fake_import(name, *a, **k):
        if name in ("automdt.agents.ppo", "automdt.simulator.oracle"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *a, **k)

    monkeypatch.setattr(registry.importlib, "import_module", fake_import)
    with pytest.raises(ImportError, match="automdt.agents.ppo"):
        make_policy("ppo:model.zip", 8)
    with pytest.raises(ImportError, match="automdt.simulator.oracle"):
        make_policy("oracle", 8)


def test_oracle_hook(monkeypatch):
    fake = types.ModuleType("automdt.simulator.oracle")
    fake.oracle_policy = lambda max_threads, **kw: StaticPolicy(2, 2, 2, name="oracle", max_threads=max_threads)
    monkeypatch.setitem(sys.modules, "automdt.simulator.oracle", fake)
    assert make_policy("oracle", 8).name == "oracle"


def test_oracle_fallback_holds_the_oracle_triple(monkeypatch):
    fake = types.ModuleType("automdt.simulator.oracle")
    fake.oracle = lambda profile, k=1.02: types.SimpleNamespace(threads=(profile, 3, 2))
    monkeypatch.setitem(sys.modules, "automdt.simulator.oracle", fake)
    p = make_policy("oracle", 8, profile=5)
    assert p.name == "oracle" and p.reset(8) == (5, 3, 2)
    with pytest.raises(ValueError, match="profile"):
        make_policy("oracle", 8)


def test_register_policy(monkeypatch):
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    register_policy("always-two", lambda max_threads, **kw: StaticPolicy(2, 2, 2, max_threads=max_threads))
    assert make_policy("always-two", 4).reset(4) == (2, 2, 2)
    for bad in ("static", "ppo", "x:y", "a.zip", ""):
        with pytest.raises(ValueError):
            register_policy(bad, StaticPolicy)
