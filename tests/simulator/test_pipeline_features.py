"""The derived inputs of the policy's pipeline that the absolute action head leans on, by hand."""
from __future__ import annotations

import numpy as np
import pytest

from automdt.simulator.dynamics import OBS_DIM, OBS_NAMES
from automdt.simulator.pipeline import DEBIAS, NOISE_PRIOR, SPARE_CAP, FeatureState, add_features, feature_dim


def _enc(threads, util, eff, fill=(0.5, 0.1), trend=(0.5, 0.5), m=32):
    e = np.zeros(OBS_DIM, dtype=np.float32)
    for i, st in enumerate(("read", "net", "write")):
        e[OBS_NAMES.index(f"{st}/threads")] = e[OBS_NAMES.index(f"prev/{st}/threads")] = threads[i] / m
        e[OBS_NAMES.index(f"{st}/utilization")] = util[i]
        e[OBS_NAMES.index(f"{st}/thread_efficiency")] = eff[i]
        e[OBS_NAMES.index(f"{st}/throughput")] = e[OBS_NAMES.index(f"prev/{st}/throughput")] = 0.5
    for j, b in enumerate(("sender", "receiver")):
        e[OBS_NAMES.index(f"buffer/{b}_fill")] = fill[j]
        e[OBS_NAMES.index(f"buffer/{b}_trend")] = trend[j]
    return e


def test_need_and_spare_by_hand():
    # 16 readers waiting half the time on a full sender buffer, 5 connections at a link that 2 of
    # them fill (efficiency 0.4), 2 busy writers
    enc = _enc((16, 5, 2), (0.5, 1.0, 1.0), (1.0, 0.4, 1.0))
    x = add_features(enc, ("need", "spare"), 32, FeatureState(1))
    assert x.shape == (OBS_DIM + feature_dim(("need", "spare")),)
    debias = 1.0 + DEBIAS * NOISE_PRIOR  # the noise level before any interval without a change
    need = x[OBS_DIM:OBS_DIM + 3] * 32
    spare = x[OBS_DIM + 3:OBS_DIM + 6] * SPARE_CAP
    assert need.tolist() == pytest.approx([8.0, 5 * 0.4 * debias, 2.0], rel=1e-5)
    assert spare.tolist() == pytest.approx([8.0, 5 - 5 * 0.4 * debias, 0.0], rel=1e-5)


def test_drain_is_the_share_of_the_buffer_lost_in_an_interval():
    # the sender buffer went from 0.4 to 0.3 (trend 0.5 + change / 2), the receiver's filled
    enc = _enc((8, 2, 2), (1, 1, 1), (1, 1, 1), fill=(0.3, 0.2), trend=(0.45, 0.6))
    x = add_features(enc, ("drain",), 32)
    assert x[OBS_DIM:].tolist() == pytest.approx([0.25, 0.0], abs=1e-6)
    emptied = add_features(_enc((8, 2, 2), (1, 1, 1), (1, 1, 1), fill=(0.0, 0.0), trend=(0.4, 0.5)), ("drain",), 32)
    assert emptied[OBS_DIM] == pytest.approx(1.0)
