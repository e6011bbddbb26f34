"""Expensive: the shards as a Slurm job array. The test installs Debian's ``slurm-wlm`` and
``munge`` when missing (root), starts its own munged and a single-node Slurm (slurmctld +
slurmd, configured here, state under a private temporary directory, unique ports), submits
``examples/slurm/automdt-shards.sbatch`` with ``sbatch --array=0-2 --wait``, compares the tree
byte for byte, then stops every daemon it started by PID. Skipped, with the reason, when the
packages cannot be installed or the daemons do not start."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.util import trees_identical

pytestmark = pytest.mark.expensive
HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 3


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _ensure_packages():
    if all(shutil.which(x) for x in ("slurmctld", "slurmd", "sbatch", "munged")):
        return None
    if os.geteuid() != 0:
        return "slurm-wlm and munge are not installed and installing them needs root"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"], capture_output=True, text=True,
                       env=env, timeout=600)
    if r.returncode != 0:
        r = subprocess.run(["sh", "-c", "apt-get update -qq && apt-get install -y -qq slurm-wlm munge"],
                           capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        return f"cannot install slurm-wlm/munge: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    return None


class SingleNodeSlurm:
    """munged + slurmctld + slurmd of our own, in a private directory; stopped by PID."""

    def __init__(self, base):
        self.base = base
        self.node = "amdti14n"
        self.procs = []
        self.env = None

    def start(self):
        b = self.base
        for d in ("state", "spool", "log", "munge"):
            os.makedirs(os.path.join(b, d), exist_ok=True)
        os.chmod(os.path.join(b, "munge"), 0o700)
        key = os.path.join(b, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = os.path.join(b, "munge", "munge.sock")
        self._spawn(["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                     f"--pid-file={b}/munge/munged.pid", f"--log-file={b}/log/munged.log",
                     f"--seed-file={b}/munge/munged.seed"], "munged")
        self._wait(lambda: os.path.exists(sock), "munged socket", 15)
        conf = os.path.join(b, "slurm.conf")
        host = socket.gethostname().split(".")[0]
        with open(conf, "w") as f:
            f.write(f"""ClusterName=amdti14
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool
SlurmctldPidFile={b}/slurmctld.pid
SlurmdPidFile={b}/slurmd.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MaxArraySize=1000
NodeName={self.node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 2} RealMemory=1000 State=UNKNOWN
PartitionName=amdt Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        self.env = dict(os.environ, SLURM_CONF=conf)
        self._spawn(["slurmctld", "-D", "-i", "-f", conf], "slurmctld")
        self._spawn(["slurmd", "-D", "-N", self.node, "-f", conf], "slurmd")

        def ready():
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env)
            return r.returncode == 0 and r.stdout.strip() in ("idle", "mixed", "allocated")

        self._wait(ready, "an idle Slurm node", 60)
        return self

    def _spawn(self, cmd, name):
        log = open(os.path.join(self.base, "log", f"{name}.out"), "w")
        self.procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)))

    def _wait(self, pred, what, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: {self.logs(name)}")
            if pred():
                return
            time.sleep(0.3)
        raise RuntimeError(f"no {what} within {timeout} s: {self.logs()}")

    def logs(self, name=None):
        out = []
        for n in ([name] if name else [n for n, _ in self.procs]):
            for suffix in (".out", ".log"):
                p = os.path.join(self.base, "log", n + suffix)
                if os.path.exists(p):
                    out.append(f"{n}{suffix}: " + " | ".join(open(p, errors="replace").read().strip().splitlines()[-4:]))
        return "; ".join(out)

    def stop(self):
        for name, p in reversed(self.procs):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait(10)
        self.procs.clear()


@pytest.mark.timeout(900)
def test_shards_as_a_slurm_array_job(tmp_path, make_tree):
    why = _ensure_packages()
    if why:
        pytest.skip(why)
    base = tmp_path / "amdt-i14-slurm"
    slurm = SingleNodeSlurm(str(base))
    try:
        try:
            slurm.start()
        except RuntimeError as e:
            pytest.skip(f"single-node Slurm did not start: {str(e)[:400]}")
        files = {f"big{i}.dat": 300_000 + 40_000 * i for i in range(4)}
        files.update({f"small/{i % 3}/s{i:03d}": (i * 7919) % 20_000 for i in range(60)})
        src = make_tree(files, dirs=["empty"])
        dst = tmp_path / "shared-dest"
        out = tmp_path / "out"
        out.mkdir()
        env = dict(slurm.env, AUTOMDT_SRC=src, AUTOMDT_DESTS=str(dst), AUTOMDT_SECRET="",
                   AUTOMDT=f"{sys.executable} -m automdt", AUTOMDT_ARGS="--threads 2,2,2",
                   AUTOMDT_METRICS_DIR=str(out), XDG_RUNTIME_DIR=str(tmp_path), PYTHONPATH=HERE)
        r = subprocess.run(["sbatch", f"--array=0-{N - 1}", "--wait", f"--output={out}/shard-%a.out",
                            "--export=ALL", os.path.join(HERE, "examples", "slurm", "automdt-shards.sbatch")],
                           capture_output=True, text=True, env=env, timeout=600, cwd=str(tmp_path))
        assert r.returncode == 0, r.stdout + r.stderr + slurm.logs() + "".join(
            p.read_text() for p in out.glob("shard-*.out"))
        sums = [json.loads((out / f"shard-{i}.out").read_text().strip().splitlines()[-1]) for i in range(N)]
        assert [s["shard"] for s in sums] == [f"{i}/{N}" for i in range(N)]
        assert all(s["exit_code"] == 0 for s in sums)
        assert sum(s["files_total"] for s in sums) == len(files)
        ok, diff = trees_identical(src, str(dst))
        assert ok, diff
        assert all((out / f"automdt-shard{i}.prom").exists() for i in range(N))
        # the array again: every shard finds its part complete
        r = subprocess.run(["sbatch", f"--array=0-{N - 1}", "--wait", f"--output={out}/again-%a.out",
                            "--export=ALL", os.path.join(HERE, "examples", "slurm", "automdt-shards.sbatch")],
                           capture_output=True, text=True, env=env, timeout=600, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        again = [json.loads((out / f"again-{i}.out").read_text().strip().splitlines()[-1]) for i in range(N)]
        assert sum(s["files_skipped"] for s in again) == len(files) and sum(s["bytes"] for s in again) == 0
    finally:
        slurm.stop()
    assert all(p.poll() is not None for _, p in slurm.procs) and not slurm.procs
