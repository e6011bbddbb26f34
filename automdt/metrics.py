"""Prometheus metrics (the ``prometheus-client`` library): the receiver daemon's ``/metrics`` and
the textfile a cron/systemd transfer leaves for node_exporter.

* :class:`ReceiverMetrics`: ``automdt receive --metrics HOST:PORT``. The receiver's control loop
  calls :meth:`ReceiverMetrics.update` a few times a second and :meth:`ReceiverMetrics.session_closed`
  when a session ends; counters grow by the difference of each session's engine counters, so
  they stay monotonic across sessions. Served by the library's own HTTP server thread.
* :func:`write_transfer_textfile`: ``automdt transfer --metrics-file FILE.prom``: the run's
  figures as gauges (the "last run" convention of node_exporter's textfile collector), written
  atomically (temporary file, then rename) by :func:`prometheus_client.write_to_textfile`.

Names follow the Prometheus conventions: base units (bytes, seconds), ``_total`` on counters.
The list is in ``docs/operator-guide.md`` ("Monitoring: Prometheus metrics").
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional, Tuple

from automdt import errors
from automdt.errors import AutomdtError

_STAGES = ("net", "write")


class ReceiverMetrics:
    """The receiver daemon's metrics in their own registry (several servers per process are fine)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector

        self.registry = reg = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=reg)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        self.sessions_active = Gauge("automdt_sessions_active", "Sender sessions open (authenticated)", registry=reg)
        self.sessions = Counter("automdt_sessions", "Sender sessions started (handshakes begun)", registry=reg)
        self.received_bytes = Counter("automdt_received_bytes", "Payload bytes received on data connections",
                                      registry=reg)
        self.written_bytes = Counter("automdt_written_bytes", "Payload bytes verified and written to disk",
                                     registry=reg)
        self.files = Counter("automdt_received_files", "Files completed and renamed into place", registry=reg)
        self.chunks_resent = Counter(
            "automdt_chunks_resent", "Chunks asked for again (after a failed checksum or a lost connection)",
            registry=reg)
        self.integrity = Counter("automdt_integrity_failures",
                                 "Chunks that failed their checksum on arrival (never written)", registry=reg)
        self.rejected = Counter("automdt_rejected_connections",
                                "Connections refused: control (wrong secret, busy) or data (bad hello or token)",
                                ["channel"], registry=reg)
        self.protocol_errors = Counter("automdt_protocol_errors", "Data connections closed for an invalid frame",
                                       registry=reg)
        self.threads = Gauge("automdt_receiver_threads", "Live threads per stage, all sessions (net = data "
                             "connections)", ["stage"], registry=reg)
        self.buffer_bytes = Gauge("automdt_receiver_buffer_bytes", "Bytes held in the staging buffers, all sessions",
                                  registry=reg)
        self.buffer_capacity = Gauge("automdt_receiver_buffer_capacity_bytes",
                                     "Capacity of the staging buffers, all sessions", registry=reg)
        self.buffer_fill = Gauge("automdt_receiver_buffer_fill_ratio",
                                 "Fill of the staging buffers (bytes held / capacity), all sessions", registry=reg)
        for ch in ("control", "data"):
            self.rejected.labels(channel=ch)
        self._control_rejected = 0
        self._sessions_seen = 0
        self._http: Any = None

    # ---------------------------------------------------------------------- serving
    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port); returns the port."""
        from prometheus_client import start_http_server

        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise AutomdtError(f"--metrics {host}:{port}: cannot listen: {e.strerror or e}", errors.USAGE) from None
        self._http = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    # --------------------------------------------------------------------- updating
    def update(self, server: Any) -> None:
        """Take the current state of ``server`` (a :class:`automdt.receiver.ReceiverServer`)."""
        rejected = int(server.auth_failures) + int(getattr(server, "busy_rejections", 0))
        if rejected > self._control_rejected:
            self.rejected.labels(channel="control").inc(rejected - self._control_rejected)
            self._control_rejected = rejected
        self._count_sessions(server)
        active = 0
        threads = dict.fromkeys(_STAGES, 0)
        fill = cap = 0
        for s in list(server.sessions.values()):
            if s.state in ("authed", "open"):
                active += 1
            st = self._take(s)
            if st is not None:
                threads["net"] += st.recv.threads_live
                threads["write"] += st.write.threads_live
                fill += st.buffer.fill_bytes
                cap += st.buffer.capacity_bytes
        self.sessions_active.set(active)
        for k, v in threads.items():
            self.threads.labels(stage=k).set(v)
        self.buffer_bytes.set(fill)
        self.buffer_capacity.set(cap)
        self.buffer_fill.set(fill / cap if cap else 0.0)

    def _count_sessions(self, server: Any) -> None:
        if server.sessions_total > self._sessions_seen:
            self.sessions.inc(server.sessions_total - self._sessions_seen)
            self._sessions_seen = server.sessions_total

    def session_closed(self, session: Any) -> None:
        """A session's last counters, taken just before its engine closes (with the sessions
        counter: a session that opens and closes within one update period still counts)."""
        self._take(session)
        server = getattr(session, "server", None)
        if server is not None:
            self._count_sessions(server)

    def _take(self, s: Any) -> Optional[Any]:
        """Add what ``s`` counted since the last look; returns its engine stats (or None)."""
        last: Dict[str, int] = s.__dict__.setdefault("_metrics_last", {})
        acct = s.accounting  # an automdt.session.Accounting
        now = {"files": acct.files_completed, "missing": acct.chunks_missing}
        st = None
        if s.engine is not None:
            try:
                st = s.engine.stats()
            except (RuntimeError, ValueError):  # closed under us
                st = None
        if st is not None:
            now.update(recv=st.recv.bytes, write=st.write.bytes, bad=st.chunks_bad,
                       rejected=st.connections_rejected, proto=st.protocol_errors)
        for key, metric in (("files", self.files), ("missing", self.chunks_resent), ("recv", self.received_bytes),
                            ("write", self.written_bytes), ("bad", self.integrity), ("bad", self.chunks_resent),
                            ("rejected", self.rejected.labels(channel="data")), ("proto", self.protocol_errors)):
            if key in now and now[key] > last.get(key, 0):
                metric.inc(now[key] - last.get(key, 0))
        # several metrics read the same key: remember the values only after all of them took theirs
        last.update(now)
        return st


# ----------------------------------------------------------------------------- the textfile
TEXTFILE_LABELS = ("job_name", "shard", "dest")


def check_textfile_path(path: str) -> None:
    """Fail early (exit 2) when ``--metrics-file`` cannot be written where it is asked."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise AutomdtError(f"--metrics-file {path}: directory {d} does not exist", errors.USAGE)
    if not os.access(d, os.W_OK):
        raise AutomdtError(f"--metrics-file {path}: directory {d} is not writable", errors.USAGE)


def write_transfer_textfile(path: str, summary: Optional[Dict[str, Any]], exit_code: int,
                            labels: Dict[str, str], seconds: Optional[float] = None) -> None:
    """Write the run's figures for node_exporter's textfile collector, atomically.

    :param summary: the run's JSON summary (``Summary.as_dict()``), or None when the run failed
        before it could produce one (then only the exit code, the time and zeros are written).
    :param labels: ``job_name``, ``shard``, ``dest`` (every series carries them).
    """
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    d = summary or {}
    reg = CollectorRegistry(auto_describe=True)
    names = list(TEXTFILE_LABELS)
    vals = [str(labels.get(k, "")) for k in names]

    def gauge(name: str, doc: str, value: float, extra: Tuple[Tuple[str, str], ...] = ()) -> None:
        g = Gauge(name, doc, names + [k for k, _ in extra], registry=reg)
        g.labels(*vals, *[v for _, v in extra]).set(value)

    gauge("automdt_transfer_exit_code", "Exit code of the last run (0: success; `automdt exit-codes`)", exit_code)
    gauge("automdt_transfer_last_run_timestamp_seconds", "When the last run ended (Unix time)", time.time())
    gauge("automdt_transfer_duration_seconds", "Wall time of the last run",
          float(d.get("seconds", seconds or 0.0)))
    gauge("automdt_transfer_bytes", "Payload bytes written by the last run", float(d.get("bytes", 0)))
    gauge("automdt_transfer_source_bytes", "Bytes of the files the last run was to keep in sync (this shard)",
          float(d.get("bytes_total", 0)))
    gauge("automdt_transfer_throughput_bytes_per_second", "Mean throughput of the last run (bytes / seconds)",
          float(d.get("bytes_per_second", 0.0)))
    gauge("automdt_transfer_chunks_resent", "Chunks sent again in the last run", float(d.get("chunks_resent", 0)))
    gauge("automdt_transfer_integrity_failures", "Files that failed integrity checks in the last run",
          float(d.get("integrity_failures", 0)))
    g = Gauge("automdt_transfer_files", "Files of the last run by outcome", names + ["state"], registry=reg)
    for state in ("transferred", "skipped", "failed"):
        g.labels(*vals, state).set(float(d.get(f"files_{state}", 0)))
    g = Gauge("automdt_transfer_threads", "Thread count per stage when the last run ended", names + ["stage"],
              registry=reg)
    for stage in ("read", "net", "write"):
        g.labels(*vals, stage).set(float((d.get("threads") or {}).get(stage, 0)))
    try:
        write_to_textfile(path, reg)
    except OSError as e:
        raise AutomdtError(f"--metrics-file {path}: {e.strerror or e}", errors.USAGE) from None
