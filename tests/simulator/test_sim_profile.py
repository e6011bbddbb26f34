"""Profile YAML round trip, bad-file errors, random profiles."""
from __future__ import annotations

import numpy as np
import pytest

from automdt.simulator.profile import STAGES, Profile, ProfileError, StageProfile, read_samples, write_samples

EXAMPLE = """\
stages:
  read:  {tpt: 40.0e6, bandwidth: 400.0e6}
  net:   {tpt: 120.0e6, bandwidth: 400.0e6}
  write: {tpt: 120.0e6, bandwidth: 400.0e6}
buffers: {sender: 268435456, receiver: 268435456}
interval_s: 1.0
max_threads: 32
noise: 0.05
"""


def test_load_documented_example(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(EXAMPLE)
    p = Profile.load(f)  # "40.0e6" is a YAML 1.1 string: accepted as a number
    assert p.read == StageProfile(40e6, 400e6) and p.net.tpt == 120e6
    assert p.sender_buffer == 2**28 and p.noise == 0.05 and p.bottleneck == "read"
    assert p.achievable_bps == 400e6


def test_yaml_and_json_round_trip(tmp_path):
    samples = [{"t": 1.0, "threads": [1, 2, 3], "bytes": [1.0, 2.0, 3.0], "busy_s": [1.0, 1.0, 1.0],
                "wait_s": [0.0, 1.0, 2.0], "interval_s": 1.0, "buffer": [0.5, 0.25]}]
    p = Profile(read=StageProfile(1.5e7, 3e8, 0.01, 0.02), net=StageProfile(1e8, 1e9), write=StageProfile(2e7, 5e8),
                sender_buffer=123456789, receiver_buffer=987654, interval_s=3.0, max_threads=20, noise=0.07,
                samples=samples, meta={"fit": {"stages": {"read": {"saturated": True}}}, "arr": np.arange(2)},
                capacity_model="concave")
    for name in ("p.yaml", "p.json"):
        p.save(tmp_path / name)
        q = Profile.load(tmp_path / name)
        assert q.to_dict() == p.to_dict()
        assert q.stages == p.stages and q.samples == samples and q.meta["arr"] == [0, 1]
    assert Profile.from_dict(p.to_dict()) == Profile.from_dict(q.to_dict())


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_samples_file(tmp_path, suffix):
    samples = [{"t": float(i), "threads": [1, 2, 3], "bytes": [1.0, 2.0, 3.0], "busy_s": [0.5, 1.0, 1.5],
                "wait_s": [0.5, 1.0, 1.5], "interval_s": 1.0, "buffer": [0.5, 0.25]} for i in range(3)]
    write_samples(samples, tmp_path / f"s{suffix}")
    assert read_samples(tmp_path / f"s{suffix}") == samples
    f = tmp_path / "p.yaml"
    f.write_text(EXAMPLE + f"samples: s{suffix}\n")
    p = Profile.load(f)
    assert p.samples == f"s{suffix}" and p.load_samples(tmp_path) == samples


BAD = [
    ("stages: [1, 2]\nbuffers: {sender: 1, receiver: 1}\n", "stages"),
    (EXAMPLE.replace("  read:  {tpt: 40.0e6, bandwidth: 400.0e6}\n", ""), "stages.read is missing"),
    (EXAMPLE.replace("tpt: 40.0e6", "tpt: -4"), "stages.read.tpt"),
    (EXAMPLE.replace("tpt: 40.0e6", "tpt: fast"), "stages.read.tpt"),
    (EXAMPLE.replace("bandwidth: 400.0e6}", "bandwidth: .nan}", 1), "stages.read.bandwidth"),
    (EXAMPLE.replace("sender: 268435456", "sender: 0"), "buffers.sender"),
    (EXAMPLE.replace("buffers: {sender: 268435456, receiver: 268435456}\n", ""), "buffers"),
    (EXAMPLE.replace("max_threads: 32", "max_threads: 2.5"), "max_threads"),
    (EXAMPLE.replace("interval_s: 1.0", "interval_s: 0"), "interval_s"),
    (EXAMPLE.replace("noise: 0.05", "noise: 0.9"), "noise"),
    (EXAMPLE + "colour: blue\n", "unknown field"),
    (EXAMPLE.replace("write: {", "disk: {tpt: 1, bandwidth: 1}\n  write: {"), "unknown stage"),
    (EXAMPLE.replace("{tpt: 40.0e6,", "{tpt: 40.0e6, speed: 3,"), "stages.read: unknown field"),
    ("stages: {read: [\n", "not valid YAML"),
    ("", "empty"),
    ("- 1\n- 2\n", "top level"),
]


@pytest.mark.parametrize("text,needle", BAD)
def test_bad_files_raise_one_line_errors(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ProfileError) as e:
        Profile.load(f)
    msg = str(e.value)
    assert str(f) in msg and needle in msg and "\n" not in msg
    assert isinstance(e.value, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="nope.yaml: cannot read"):
        Profile.load(tmp_path / "nope.yaml")


def test_constructor_validates():
    with pytest.raises(ProfileError, match="tpt"):
        StageProfile(tpt=0.0, bandwidth=1.0)
    with pytest.raises(ProfileError, match="max_threads"):
        Profile.default().replace(max_threads=0)
    with pytest.raises(ProfileError, match="capacity_model"):
        Profile.default().replace(capacity_model="magic")


def test_random_profiles_are_broad_and_valid():
    rng = np.random.default_rng(0)
    ps = [Profile.random(rng) for _ in range(600)]
    bottlenecks = {s: sum(p.bottleneck == s for p in ps) for s in STAGES}
    assert all(v > 120 for v in bottlenecks.values()), bottlenecks  # read-, net-, write-bound all likely
    tpt = np.array([p.tpt_array() for p in ps])
    bw = np.array([p.bandwidth_array() for p in ps])
    assert tpt.min() >= 20e6 - 1 and tpt.max() <= 2e9 + 1 and tpt.max() / tpt.min() > 30
    assert bw.min() >= 100e6 - 1 and bw.max() <= 10e9 + 1 and bw.min(axis=1).max() > 5e9
    from automdt.simulator.oracle import oracle

    n_opt = np.array([oracle(p).threads for p in ps[:60]])
    assert (n_opt == 1).any() and (n_opt >= 16).any()  # optima spread over the thread range
    assert Profile.random(np.random.default_rng(5)) == Profile.random(np.random.default_rng(5))
