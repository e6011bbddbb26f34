"""Prometheus metrics: ``automdt receive --metrics`` scraped over HTTP and the ``transfer
--metrics-file`` textfile, both parsed with prometheus-client's own text parser."""
import os
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from automdt import errors
from automdt.lock import JobLock, default_lock_path
from tests.faults.helpers import ReceiverProc, wait_for
from tests.util import run_cli, trees_identical


def _parse(text):
    """{(sample name, frozenset(labels)): value} plus the family types."""
    samples, types = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, types


def _scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        return _parse(r.read().decode())


def _v(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def _metrics_port(rp):
    line = [x for x in rp.stderr().splitlines() if "metrics on http://" in x][0]
    return int(line.rsplit(":", 1)[1].split("/")[0])


def test_receiver_metrics_scraped_and_parsed(tmp_path, make_tree):
    src = make_tree({f"d/f{i}": 150_000 + i for i in range(8)} | {"empty": 0})
    root = tmp_path / "root"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"metrics-test-secret")
    secret.chmod(0o600)  # a secret open to others is refused
    rp = ReceiverProc(str(root), str(secret), str(tmp_path), extra=["--metrics", "127.0.0.1:0"]).start()
    try:
        port = _metrics_port(rp)
        samples, types = _scrape(port)
        assert _v(samples, "automdt_sessions_total") == 0
        assert _v(samples, "automdt_received_bytes_total") == 0
        assert types["automdt_received_bytes"] == "counter" and types["automdt_sessions_active"] == "gauge"
        # a sender with the wrong secret: a rejected control connection
        bad = tmp_path / "bad"
        bad.write_bytes(b"wrong")
        bad.chmod(0o600)
        code, _, err = run_cli("transfer", src, rp.dest + "/x", "--secret-file", str(bad), "--retries", "0")
        assert code == errors.FATAL, err
        code, s, err = run_cli("transfer", src, rp.dest + "/run", "--secret-file", str(secret), "--json")
        assert code == 0 and trees_identical(src, str(root / "run"))[0], err
        total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(src) for f in fs)
        assert wait_for(lambda: _v(_scrape(port)[0], "automdt_written_bytes_total") == total, 5)
        assert wait_for(lambda: _v(_scrape(port)[0], "automdt_sessions_active") == 0, 5)
        # the control channel's rejections reach the registry at the next update period
        assert wait_for(lambda: _v(_scrape(port)[0], "automdt_rejected_connections_total", channel="control") == 1, 5)
        samples, _ = _scrape(port)
        assert _v(samples, "automdt_received_bytes_total") == total
        assert _v(samples, "automdt_received_files_total") == 9  # 8 sent, 1 empty created
        assert _v(samples, "automdt_sessions_total") == 2
        assert _v(samples, "automdt_sessions_active") == 0
        assert _v(samples, "automdt_rejected_connections_total", channel="control") == 1
        assert _v(samples, "automdt_rejected_connections_total", channel="data") == 0
        assert _v(samples, "automdt_integrity_failures_total") == 0
        assert _v(samples, "automdt_chunks_resent_total") == 0
        for stage in ("net", "write"):
            assert _v(samples, "automdt_receiver_threads", stage=stage) == 0  # no session left
        assert _v(samples, "automdt_receiver_buffer_fill_ratio") == 0
        assert _v(samples, "process_resident_memory_bytes") > 10 << 20
        # a data connection with a wrong token while a session is open: counted as rejected (data)
        from tests.faults.helpers import FakeSender
        import zmq

        ctx = zmq.Context()
        f = FakeSender(ctx, rp.port, b"metrics-test-secret")
        try:
            f.handshake(subdir="fake")
            assert wait_for(lambda: _v(_scrape(port)[0], "automdt_sessions_active") == 1, 5)
            # the session counts as active from its authentication on; its engine's threads show from
            # the first update after they started (the gauges are taken once per update period)
            assert wait_for(lambda: _v(_scrape(port)[0], "automdt_receiver_threads", stage="write") >= 1, 5)
            samples, _ = _scrape(port)
            assert _v(samples, "automdt_receiver_buffer_capacity_bytes") >= 1 << 20
            s = f.connect(token=b"\0" * 32)
            s.close()
            assert wait_for(lambda: _v(_scrape(port)[0], "automdt_rejected_connections_total", channel="data") == 1, 5)
        finally:
            f.close()
            ctx.term()
        assert rp.alive()
    finally:
        rp.stop()


def test_metrics_port_in_use_is_one_line_exit_2(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        code, _, err = run_cli("receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path),
                               "--metrics", f"127.0.0.1:{busy.getsockname()[1]}", timeout=30)
        assert code == errors.USAGE
        assert err.strip().count("\n") == 0 and "--metrics" in err and "cannot listen" in err, err
        code, _, err = run_cli("receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path), "--metrics", "nope")
        assert code == errors.USAGE and "bad address" in err and err.strip().count("\n") == 0
    finally:
        busy.close()


def test_transfer_textfile_parsed(tmp_path, make_tree):
    src = make_tree({"a/x": 70_000, "a/y": 1234, "z": 0})
    dst = str(tmp_path / "dst")
    prom = tmp_path / "textfile" / "automdt-run42.prom"
    prom.parent.mkdir()
    code, s, err = run_cli("transfer", src, dst, "--json", "--metrics-file", str(prom), "--metrics-job", "run42")
    assert code == 0, err
    samples, types = _parse(prom.read_text())
    lab = {"job_name": "run42", "shard": "", "dest": dst}
    assert _v(samples, "automdt_transfer_exit_code", **lab) == 0
    assert _v(samples, "automdt_transfer_bytes", **lab) == s["bytes"] == 71234
    assert _v(samples, "automdt_transfer_files", state="transferred", **lab) == 3
    assert _v(samples, "automdt_transfer_duration_seconds", **lab) == pytest.approx(s["seconds"], abs=1e-3)
    assert _v(samples, "automdt_transfer_throughput_bytes_per_second", **lab) == pytest.approx(s["bytes_per_second"])
    assert _v(samples, "automdt_transfer_threads", stage="net", **lab) == s["threads"]["net"] == 2
    assert _v(samples, "automdt_transfer_last_run_timestamp_seconds", **lab) > 1.7e9
    assert all(t == "gauge" for t in types.values())
    assert [p.name for p in prom.parent.iterdir()] == ["automdt-run42.prom"]  # no temporary left
    # a run skipped because the lock is held still reports its exit code (the cron convention)
    with JobLock(default_lock_path(src, dst)):
        code, _, err = run_cli("transfer", src, dst, "--metrics-file", str(prom), "--metrics-job", "run42")
    assert code == errors.LOCK_BUSY
    samples, _ = _parse(prom.read_text())
    assert _v(samples, "automdt_transfer_exit_code", **lab) == errors.LOCK_BUSY
    assert _v(samples, "automdt_transfer_bytes", **lab) == 0
    # a second successful run: nothing to move
    code, _, err = run_cli("transfer", src, dst, "--metrics-file", str(prom), "--metrics-job", "run42")
    samples, _ = _parse(prom.read_text())
    assert code == 0 and _v(samples, "automdt_transfer_files", state="skipped", **lab) == 3


def test_metrics_file_in_missing_directory_is_exit_2(tmp_path, make_tree):
    src = make_tree({"a": 10})
    code, _, err = run_cli("transfer", src, str(tmp_path / "d"), "--metrics-file", str(tmp_path / "no" / "m.prom"))
    assert code == errors.USAGE and "does not exist" in err and err.strip().count("\n") == 0
    assert not (tmp_path / "d").exists()
