"""Rao et al. concave-convex profile: recovery of the transition RTT, shape flags, I/O, sweep, CLI."""
import json

import numpy as np
import pytest

from automdt.experiments.rao import _g, fit_profile, load_measurements, main, sweep

RTTS = np.linspace(0.0, 0.2, 41)                  # 0-200 ms every 5 ms
B = 1.25e9                                        # 10 Gbit/s in bytes/s


def model(t, tT, a1, tau1, a2, tau2, b=B):
    """The paper's f = b [g_{a1,tau1} I(t <= tT) + g_{a2,tau2} I(t > tT)]."""
    return b * np.where(t <= tT, _g(t, a1, tau1), _g(t, a2, tau2))


def noisy(y, rng, rel=0.03, repeats=3):
    y = np.repeat(y, repeats)
    return y * (1 + rel * rng.standard_normal(y.size))


@pytest.mark.parametrize("seed,tT", [(0, 0.06), (1, 0.09), (2, 0.14)])
def test_recovers_transition_rtt_continuous_model(seed, tT):
    # Both pieces meet at b/2 at tT (tau1 = tau2 = tT), with different steepness on each side.
    rng = np.random.default_rng(seed)
    y = noisy(model(RTTS, tT, 40.0, tT, 60.0, tT), rng)
    fit = fit_profile(np.repeat(RTTS, 3), y)
    assert fit.shape == "concave-convex"
    assert abs(fit.transition_rtt_s - tT) <= 0.1 * tT
    assert fit.tau2_s <= fit.transition_rtt_s <= fit.tau1_s          # the paper's constraint
    assert fit.r2 > 0.97 and fit.rel_rmse < 0.05
    assert fit.b == pytest.approx(B, rel=0.1)


def test_recovers_transition_rtt_with_a_jump():
    # Concave piece centred past tT and convex piece centred before it: throughput drops at tT.
    rng = np.random.default_rng(3)
    tT = 0.1
    y = noisy(model(RTTS, tT, 30.0, tT + 0.04, 40.0, tT - 0.005), rng)
    for criterion in ("bic", "sse"):
        fit = fit_profile(np.repeat(RTTS, 3), y, criterion=criterion)
        assert fit.shape == "concave-convex"
        assert abs(fit.transition_rtt_s - tT) <= 0.1 * tT
    # With the paper's scaling (b fixed to the capacity) too.
    fit = fit_profile(np.repeat(RTTS, 3), y, capacity=B)
    assert fit.capacity_fixed and fit.b == B
    assert abs(fit.transition_rtt_s - tT) <= 0.1 * tT
    # The fitted function follows the model away from the jump (next to it, the shared point at
    # tau_T pulls both pieces towards b/2, as in the paper's (3.1)).
    away = np.abs(RTTS - fit.transition_rtt_s) > 0.0101
    err = fit.predict(RTTS) - model(RTTS, tT, 30.0, tT + 0.04, 40.0, tT - 0.005)
    assert np.abs(err[away]).max() < 0.08 * B and fit.r2 > 0.95
    assert np.all(np.isfinite(fit.predict(RTTS)))


@pytest.mark.parametrize("seed", [0, 1])
def test_flags_convex_only_and_concave_only(seed):
    rng = np.random.default_rng(10 + seed)
    x = np.repeat(RTTS, 3)
    convex = fit_profile(x, noisy(_g(RTTS, 30.0, -0.01) * B, rng))        # LNet-like: convex throughout
    assert convex.shape == "convex" and convex.transition_rtt_s == 0.0
    assert convex.a1 is None and np.isnan(convex.concave(0.05)) and np.isfinite(convex.predict(0.05))
    concave = fit_profile(x, noisy(_g(RTTS, 15.0, 0.25) * B, rng))        # XDD-like: concave throughout
    assert concave.shape == "concave" and concave.transition_rtt_s == pytest.approx(0.2)
    assert concave.a2 is None
    flat = fit_profile(x, noisy(np.full(RTTS.size, B), rng))               # no RTT-dependent limit
    assert flat.shape == "concave"


def test_window_limited_profile():
    # min(C, W/RTT): flat up to the BDP knee, convex after. The sigmoid pieces put tau_T where
    # the throughput has fallen to about half (their convex half lies below b/2): ~1.5-2.5 knees.
    rng = np.random.default_rng(7)
    C, knee = 2e8, 0.03
    y = np.minimum(C, C * knee / np.maximum(RTTS, 1e-9))
    fit = fit_profile(RTTS, y * (1 + 0.03 * rng.standard_normal(y.size)))
    assert fit.shape == "concave-convex"
    assert 1.3 * knee <= fit.transition_rtt_s <= 2.5 * knee


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        fit_profile([0.0, 0.01, 0.01], [1.0, 2.0, 3.0])                    # 2 distinct RTTs
    with pytest.raises(ValueError):
        fit_profile([0.0, 0.01, -0.02], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        fit_profile([0.0, 0.01, 0.02], [1.0, np.nan, 3.0])
    with pytest.raises(ValueError):
        fit_profile([0.0, 0.01, 0.02], [1.0, 2.0])
    with pytest.raises(ValueError):
        fit_profile([0.0, 0.01, 0.02], [0.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        fit_profile([0.0, 0.01, 0.02], [3.0, 2.0, 1.0], criterion="aic")


def test_load_measurements_formats(tmp_path):
    rtt = np.array([0.0, 0.01, 0.02])
    tput = np.array([1e9, 9e8, 5e8])
    (tmp_path / "a.csv").write_text("rtt_ms,throughput_gbps,note\n0,8,x\n10,7.2,y\n20,4,z\n")
    (tmp_path / "b.csv").write_text("# rtt_s, bytes/s\n0,1e9\n0.01,9e8\n0.02,5e8\n")
    (tmp_path / "c.json").write_text(json.dumps({"rtt_s": rtt.tolist(), "throughput_bps": tput.tolist()}))
    (tmp_path / "d.json").write_text(json.dumps(
        {"measurements": [{"rtt_us": r * 1e6, "throughput_bps": v} for r, v in zip(rtt, tput)]}))
    (tmp_path / "e.json").write_text(json.dumps([[r, v] for r, v in zip(rtt, tput)]))
    for name in "a.csv", "b.csv", "c.json", "d.json", "e.json":
        r, t = load_measurements(str(tmp_path / name))
        np.testing.assert_allclose(r, rtt, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(t, tput, rtol=1e-9, err_msg=name)
    (tmp_path / "bad.csv").write_text("latency,speed\n1,2\n")
    with pytest.raises(ValueError, match="RTT column"):
        load_measurements(str(tmp_path / "bad.csv"))


def test_sweep_through_forwarder():
    recs = sweep([0.0, 0.04], streams=2, seconds=0.3, sndbuf=256 * 1024, pings=3)
    assert [r["rtt_s"] for r in recs] == [0.0, 0.04]
    assert recs[1]["rtt_measured_s"] >= 0.038
    limit = 2 * 256 * 1024 / 0.04
    assert recs[1]["throughput_bps"] <= 1.2 * limit < recs[0]["throughput_bps"]
    assert {"streams", "seconds", "window_bytes", "repeat"} <= set(recs[0])


def test_command_line_measurements(tmp_path, capsys):
    rng = np.random.default_rng(5)
    y = noisy(model(RTTS, 0.08, 40.0, 0.08, 60.0, 0.08), rng, repeats=1)
    path = tmp_path / "m.csv"
    path.write_text("rtt_ms,throughput_bps\n" + "".join(f"{r * 1e3},{v}\n" for r, v in zip(RTTS, y)))
    out = tmp_path / "out"
    assert main(["--measurements", str(path), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "transition RTT tau_T: 80 ms" in text and "concave-convex" in text
    for f in ("rao_measurements.csv", "rao_fit.csv", "rao_fit.json", "rao_profile.png"):
        assert (out / f).stat().st_size > 0
    saved = json.loads((out / "rao_fit.json").read_text())
    assert saved["fit"]["transition_rtt_s"] == pytest.approx(0.08)
    r, t = load_measurements(str(out / "rao_measurements.csv"))       # the output reads back
    assert r.size == RTTS.size
    assert main(["--measurements", str(tmp_path / "missing.csv")]) == 2
