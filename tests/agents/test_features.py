"""A policy's optional hooks (automdt.policy_contract.PolicyBase) survive every wrapper, and the
controller, the start rules and the shield read them explicitly, never by probing attributes."""
import os
import re

import pytest

from automdt.agents.registry import _FACTORIES, make_policy
from automdt.agents.shield import Shield
from automdt.policy_contract import Features, Observation, PolicyBase, PolicyWrapper, as_policy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPECS = sorted({"default", "capacity", "static:3,2,5", "ppo", "tuned-file", *_FACTORIES})


def _obs(threads, rate=40e6):
    return Observation(tuple(threads), (rate, rate * 0.9, rate * 0.8), (0.4, 0.2), busy_s=(2.0, 1.5, 1.0),
                       wait_s=(0.5, 0.5, 0.5))


@pytest.fixture(autouse=True)
def _tuned_file(tmp_path, monkeypatch):
    """``tuned-file`` in :data:`SPECS` names a tuned policy file written for the test."""
    from tests.agents.test_tuned import _random_file

    path = str(_random_file(tmp_path))
    real = make_policy

    def make(spec, m, **kw):
        spec = spec.replace("tuned-file", f"ppo:{path}")
        return real(spec, m, **kw)

    monkeypatch.setitem(globals(), "make_policy", make)


def _wrappers(spec):
    return {"Shield": lambda: Shield(make_policy(spec, 8), 8), "PolicyWrapper": lambda: PolicyWrapper(make_policy(spec, 8)),
            "shield:SPEC": lambda: make_policy(f"shield:{spec}", 8)}


@pytest.mark.parametrize("spec", SPECS)
def test_every_registered_policy_keeps_its_features_under_every_wrapper(spec):
    """The features, a start given from outside and the annotation pass through unchanged: the
    wrapped policy acts exactly as the bare one after the same start."""
    for name, make in _wrappers(spec).items():
        bare, wrapped = make_policy(spec, 8), make()
        assert isinstance(wrapped.features(), Features)
        assert wrapped.features() == bare.features(), (spec, name)
        bare.reset(8, 0)
        wrapped.reset(8, 0)
        bare.start_from((3, 2, 5))
        wrapped.start_from((3, 2, 5))
        threads = (3, 2, 5)
        for i in range(4):
            want = bare.act(_obs(threads, 40e6 + i))
            got = wrapped.act(_obs(threads, 40e6 + i))
            assert got == want, (spec, name, i)
            assert set(bare.annotation()) <= set(wrapped.annotation()), (spec, name)
            threads = want


def test_a_policy_of_ones_own_gets_the_defaults_and_a_declared_feature_is_kept():
    class Plain:
        name = "plain"

        def reset(self, max_threads, seed=None):
            return (1, 2, 3)

        def act(self, obs):
            return obs.threads

    class Declares(PolicyBase):
        name = "declares"

        def reset(self, max_threads, seed=None):
            return (1, 2, 3)

        def act(self, obs):
            return obs.threads

        def features(self):
            return Features(asked_in_tail=True)

    plain = as_policy(Plain())
    assert plain.name == "plain" and plain.features() == Features() and plain.annotation() == {}
    plain.start_from((2, 2, 2))  # a no-op, not an error
    assert Shield(Declares(), 8).features().asked_in_tail
    assert not Shield(Plain(), 8).features().asked_in_tail
    assert Shield(Declares(), 8).name == "shield:declares"


def test_the_controller_the_start_rules_and_the_shield_never_probe_a_policy():
    probe = re.compile(r"\b(?:hasattr|getattr)\(\s*(?:self\.)?policy\b|def __getattr__")
    for rel in ("automdt/controller.py", "automdt/start.py", "agents/shield.py"):
        with open(os.path.join(ROOT, rel)) as f:
            found = [line.strip() for line in f if probe.search(line)]
        assert not found, f"{rel} probes a policy's attributes: {found}"
