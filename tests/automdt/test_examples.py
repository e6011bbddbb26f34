"""Deploying from ``examples/`` as a new operator would: the units pass ``systemd-analyze verify``,
their command lines run as written (with the directories systemd would create for them), the
README's secret recipe gives a secret automdt accepts, and the Slurm script stops loudly when the
secret file is missing."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from automdt import errors
from tests.util import trees_identical, write_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EX = os.path.join(ROOT, "examples")
UNITS = ["automdt-receive.service", "automdt-shard@.service", "automdt-shard@.timer"]
INSTALLED = "/usr/local/bin/automdt"
AUTOMDT = os.path.join(os.path.dirname(sys.executable), "automdt")
SECRET_RECIPE = "head -c 32 /dev/urandom | base64 > /etc/automdt/secret"


def _unit(name):
    with open(os.path.join(EX, "systemd", name)) as f:
        return f.read()


def _settings(text):
    """``{key: [values...]}`` of a unit's settings (continuation lines joined, comments left out)."""
    out = {}
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if line.strip() and not line.startswith(("#", ";", "[")) and "=" in line:
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def _readme():
    with open(os.path.join(EX, "README.md")) as f:
        return f.read()


# ------------------------------------------------------------------------------ systemd-analyze
def test_units_pass_systemd_analyze_verify(tmp_path):
    """With the command installed where ExecStart looks for it (here: the test's own automdt in its
    place), `systemd-analyze verify` has nothing to say about any unit."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here (apt-get install systemd): the units are not verified")
    for name in UNITS:
        (tmp_path / name).write_text(_unit(name).replace(INSTALLED, AUTOMDT))
    p = subprocess.run([tool, "verify", "--man=no", *[f"./{n}" for n in UNITS]], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr
    # as shipped, the only complaint on a machine without the install step is the missing command
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in UNITS:
        (shipped / name).write_text(_unit(name))
    p = subprocess.run([tool, "verify", "--man=no", *[f"./{n}" for n in UNITS]], cwd=shipped,
                       capture_output=True, text=True, timeout=60)
    assert all(INSTALLED in line for line in p.stderr.splitlines()), p.stderr


def test_units_say_how_to_install_and_create_what_they_write():
    for name in ("automdt-receive.service", "automdt-shard@.service"):
        text = _unit(name)
        s = _settings(text)
        assert s["User"] == ["dtn"] and s["ExecStart"][0].startswith(INSTALLED + " "), name
        assert f"ln -s /opt/automdt/.venv/bin/automdt {INSTALLED}" in text, name  # how it gets there
        assert "chmod 600 /etc/automdt/secret" in text or "chmod 600" in text, name
    shard = _settings(_unit("automdt-shard@.service"))
    assert shard["LogsDirectory"] == ["automdt"] and "automdt" in shard["StateDirectory"][0].split()
    assert SECRET_RECIPE in _unit("automdt-receive.service") and SECRET_RECIPE in _readme()


# ------------------------------------------------------------------------------ running them
def _exec_start(name, env, specifiers):
    """The unit's ExecStart as argv: ${VAR} and $VAR from ``env`` (an unbraced empty one drops
    out, as systemd splits it), %X specifiers from ``specifiers``, and the installed command
    replaced by this test's automdt."""
    line = _settings(_unit(name))["ExecStart"][0].replace(INSTALLED, AUTOMDT)
    for k, v in specifiers.items():
        line = line.replace(k, v)
    line = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line)
    line = re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), ""), line)
    return shlex.split(line)


def _made_directories(name, base):
    """Create what systemd creates for the unit (``LogsDirectory=`` under base/log,
    ``StateDirectory=`` under base/state) and nothing else; returns the %L and %S roots."""
    s = _settings(_unit(name))
    roots = {"LogsDirectory": base / "log", "StateDirectory": base / "state"}
    for key, root in roots.items():
        root.mkdir(exist_ok=True)
        for d in " ".join(s.get(key, [])).split():
            (root / d).mkdir(parents=True, exist_ok=True)
    return str(roots["LogsDirectory"]), str(roots["StateDirectory"])


def test_the_receive_and_shard_units_run_as_written(tmp_path):
    from tests.faults.helpers import free_port, wait_for

    etc = tmp_path / "etc"
    etc.mkdir()
    secret = etc / "secret"
    subprocess.run(["sh", "-c", SECRET_RECIPE.replace("/etc/automdt/secret", str(secret)) + f" && chmod 600 {secret}"],
                   check=True)
    src = tmp_path / "out"
    for i in range(5):
        write_file(str(src / f"d{i % 2}" / f"f{i}.bin"), 20_000 + i, seed=i)
    data_in = tmp_path / "in"
    data_in.mkdir()
    port = free_port()
    renv = {"LISTEN": f"127.0.0.1:{port}", "ROOT": str(data_in), "AUTOMDT_RECEIVE_ARGS": ""}
    argv = [a.replace("/etc/automdt/secret", str(secret)) for a in _exec_start("automdt-receive.service", renv, {})]
    log = tmp_path / "receive.err"
    with open(log, "w") as err:
        rx = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        assert wait_for(lambda: "receiving into" in log.read_text() or rx.poll() is not None, 20), log.read_text()
        assert rx.poll() is None, log.read_text()
        logs, state = _made_directories("automdt-shard@.service", tmp_path)
        senv = {"SRC": str(src), "DEST": f"127.0.0.1:{port}/run42", "SHARDS": "1"}
        argv = [a.replace("/etc/automdt/secret", str(secret))
                for a in _exec_start("automdt-shard@.service", senv, {"%i": "0", "%L": logs, "%S": state})]
        env = dict(os.environ)
        for k, v in _settings(_unit("automdt-shard@.service")).items():
            if k == "Environment":
                for pair in shlex.split(v[0]):
                    name, value = pair.split("=", 1)
                    env[name] = value.replace("%S", state)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        ok, diff = trees_identical(str(src), str(data_in / "run42"))
        assert ok, diff
        summary = json.loads((tmp_path / "log" / "automdt" / "shard-0.json").read_text())
        assert summary["exit_code"] == 0 and summary["files_transferred"] == 5
        assert (tmp_path / "state" / "automdt" / "textfile" / "automdt-shard-0.prom").exists()
        assert env["XDG_STATE_HOME"] == state  # the job history goes under StateDirectory= (state/automdt/jobs)
    finally:
        rx.terminate()
        rx.wait(10)


def test_the_readme_secret_recipe_gives_a_secret_automdt_accepts(tmp_path):
    from automdt.protocol import read_secret

    secret = tmp_path / "secret"
    subprocess.run(["sh", "-c", SECRET_RECIPE.replace("/etc/automdt/secret", str(secret))], check=True)
    os.chmod(secret, 0o600)
    assert len(read_secret(str(secret))) == 44  # base64 of 32 bytes


# ------------------------------------------------------------------------------ Slurm
def _sbatch(tmp_path, **env):
    """Run the Slurm script as array task 1 of 2 without Slurm; ``automdt`` is a stub that records
    its arguments. Returns (CompletedProcess, the stub's argv or None)."""
    stub = tmp_path / "automdt-stub"
    record = tmp_path / "argv.json"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
    stub.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if k != "AUTOMDT_SECRET"}
    e.update(SLURM_ARRAY_TASK_COUNT="2", SLURM_ARRAY_TASK_ID="1", AUTOMDT_SRC=str(tmp_path),
             AUTOMDT_DESTS="dtn-in:5000/run42", AUTOMDT=str(stub), **env)
    p = subprocess.run(["bash", os.path.join(EX, "slurm", "automdt-shards.sbatch")], capture_output=True, text=True,
                       env=e, timeout=60)
    return p, (json.loads(record.read_text()) if record.exists() else None)


def test_the_slurm_script_stops_loudly_without_its_secret(tmp_path):
    missing = tmp_path / "no-such-secret"
    p, argv = _sbatch(tmp_path, AUTOMDT_SECRET=str(missing))
    assert p.returncode == errors.USAGE and argv is None, (p.returncode, argv)
    assert str(missing) in p.stderr and "head -c 32 /dev/urandom | base64" in p.stderr, p.stderr
    if not os.path.exists("/etc/automdt/secret"):  # the default, unset
        p, argv = _sbatch(tmp_path)
        assert p.returncode == errors.USAGE and argv is None and "/etc/automdt/secret" in p.stderr, p.stderr


def test_the_slurm_script_passes_a_secret_or_explicitly_none(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x\n")
    secret.chmod(0o600)
    p, argv = _sbatch(tmp_path, AUTOMDT_SECRET=str(secret))
    assert p.returncode == 0, p.stderr
    assert argv[argv.index("--secret-file") + 1] == str(secret) and argv[argv.index("--shard") + 1] == "1/2"
    p, argv = _sbatch(tmp_path, AUTOMDT_SECRET="")
    assert p.returncode == 0 and "--secret-file" not in argv, (p.stderr, argv)
