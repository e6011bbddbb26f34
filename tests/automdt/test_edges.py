"""The rough edges of issue 12, each on real processes, files and loopback receivers: explore's
weak fits and remote scratch, receiver logs and sessions after Ctrl-C, debris after failed runs,
the lock directory, cron-quiet runs, results never lost, broken pipes, dry runs, fast failures,
policies of one's own, the progress line, and a help text for every option."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from tests.faults.helpers import ReceiverProc, temporaries, tmpfs, wait_for  # noqa: E402
from tests.util import CHUNK, run_cli, trees_identical, write_file  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tree(base, n, size, name="src"):
    src = base / name
    for i in range(n):
        write_file(str(src / f"d{i % 3}" / f"f{i}.bin"), size, seed=i)
    return str(src)


def _secret(tmp_path):
    s = tmp_path / "secret"
    s.write_text("edges-secret\n")
    s.chmod(0o600)
    return str(s)


def _popen(*args, **kw):
    return subprocess.run([sys.executable, "-m", "automdt", *args], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 120), **kw)


# ------------------------------------------------------------------------------------ explore
def test_explore_refuses_a_weak_fit_unless_allowed(tmp_path):
    src = _tree(tmp_path, 4, 16 * CHUNK)
    out = tmp_path / "p.yaml"
    args = ["explore", src, str(tmp_path / "dst"), "-o", str(out), "--duration", "2.5", "--interval", "0.5",
            "--chunk-size", str(CHUNK), "--memory", "1Mi", "--throttle", "read.total=1M", "--max-threads", "4"]
    p = _popen(*args)
    assert p.returncode == errors.WEAK_FIT, p.stderr
    assert not out.exists()
    weak = tmp_path / "p.weak.yaml"
    assert weak.exists() and "weak fit, not written to" in p.stderr and "--allow-weak-fit" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    from automdt.simulator.profile import Profile

    fit = Profile.load(weak).meta["fit"]
    assert fit["weak"] and any("intervals" in r for r in fit["weak"])
    assert set(fit["confidence"]) == {"read", "net", "write"}
    assert not (tmp_path / "dst" / ".automdt-explore-scratch").exists()  # the local scratch is gone
    p = _popen(*args, "--allow-weak-fit")
    assert p.returncode == 0, p.stderr
    assert out.exists() and "weak fit (written anyway" in p.stderr
    # every stage says how much it can be trusted; a lower bound never shows as "(±0%)"
    stage_lines = [ln for ln in p.stdout.splitlines() if ln.startswith("  ")]
    assert len(stage_lines) == 3, p.stdout
    conf = Profile.load(out).meta["fit"]["confidence"]
    for ln in stage_lines:
        name = ln.split()[0]
        assert ("lower bound" in ln) == (not conf[name]["tpt_measured"] or not conf[name]["bandwidth_measured"]), ln
        assert "(±0%)" not in ln


def test_explore_into_a_remote_destination_that_holds_the_data(tmp_path):
    """The data is already there: further rounds go to a scratch subdirectory the receiver empties
    and removes; the exploration gets its time and the real copy stays untouched."""
    src = _tree(tmp_path, 6, 16 * CHUNK)
    root = tmp_path / "root"
    root.mkdir()
    secret = _secret(tmp_path)
    rx = ReceiverProc(str(root), secret, str(tmp_path))
    try:
        rx.start()
        dest = f"{rx.dest}/job"
        code, _, err = run_cli("transfer", src, dest, "--secret-file", secret, "--no-lock")
        assert code == 0, err
        (root / "job" / ".automdt-explore-scratch-1").mkdir()  # left by a killed exploration
        (root / "job" / ".automdt-explore-scratch-1" / "stale").write_bytes(b"x" * 100)
        p = _popen("explore", src, dest, "-o", str(tmp_path / "p.yaml"), "--duration", "4", "--interval", "0.5",
                   "--secret-file", secret, "--chunk-size", str(CHUNK), "--memory", "1Mi", "--max-threads", "4",
                   "--throttle", "read.total=3M", "--json", "--allow-weak-fit")
        assert p.returncode == 0, p.stderr
        res = json.loads(p.stdout)
        assert res["rounds"] >= 2 and res["intervals"] >= 3, res  # the rounds after the first went to scratch
        assert not any("ended after" in r for r in res["weak_fit"]), res["weak_fit"]
        assert sorted(os.listdir(root / "job")) == ["d0", "d1", "d2"]  # no scratch left, stale one removed
        assert trees_identical(src, str(root / "job"))[0]
    finally:
        rx.stop()


# ---------------------------------------------------------------------------------- receiver
def test_receiver_log_and_session_closed_at_once_after_ctrl_c(tmp_path):
    src = _tree(tmp_path, 6, 32 * CHUNK)
    root = tmp_path / "root"
    root.mkdir()
    secret = _secret(tmp_path)
    rx = ReceiverProc(str(root), secret, str(tmp_path))
    try:
        rx.start()
        args = [sys.executable, "-m", "automdt", "transfer", src, f"{rx.dest}/job", "--secret-file", secret,
                "--no-lock", "--threads", "2,2,2", "--chunk-size", str(CHUNK), "--throttle", "read.total=2M", "-q"]
        s = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert wait_for(lambda: "opened" in rx.stderr(), 20)
        time.sleep(1.0)
        s.send_signal(signal.SIGINT)
        assert s.wait(30) == 130
        # the receiver closes the session when the sender says so, not after --idle-timeout
        assert wait_for(lambda: "closed by the sender" in rx.stderr(), 3), rx.stderr()
        assert run_cli("transfer", src, f"{rx.dest}/job", "--secret-file", secret, "--no-lock",
                       "--chunk-size", str(CHUNK))[0] == 0
        assert wait_for(lambda: rx.stderr().count("closed by the sender") == 2, 5)
    finally:
        rx.stop()
    log = rx.stderr()
    assert "takes over" not in log and "taken over" not in log
    lines = [ln for ln in log.splitlines() if " session " in ln]
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} automdt: session ([0-9a-f]+) ")
    ids = [stamp.match(ln).group(1) for ln in lines]  # every line has a time; ids are whole
    assert all(len(i) >= 10 for i in ids), ids
    assert len(set(ids)) == 2
    opened = [ln for ln in lines if " opened: into " in ln]
    closed = [ln for ln in lines if "closed by the sender:" in ln]
    assert len(opened) == len(closed) == 2
    totals = [re.search(r"(\d+) files completed, (\d+) failed, (\d+) left partial; (\d+) bytes written", ln).groups()
              for ln in closed]
    first, second = [tuple(map(int, t)) for t in totals]
    assert first[2] > 0 and second[2] == 0 and first[0] + second[0] == 6
    assert first[3] + second[3] >= 6 * 32 * CHUNK


def test_a_dead_senders_files_are_taken_over_with_one_log_line(tmp_path):
    """kill -9 leaves the session open until --idle-timeout; the re-run takes its files over at
    once, and the receiver says so once, not once per file."""
    src = _tree(tmp_path, 8, 32 * CHUNK)
    root = tmp_path / "root"
    root.mkdir()
    secret = _secret(tmp_path)
    rx = ReceiverProc(str(root), secret, str(tmp_path))
    try:
        rx.start()
        args = [sys.executable, "-m", "automdt", "transfer", src, f"{rx.dest}/job", "--secret-file", secret,
                "--no-lock", "--threads", "2,2,2", "--chunk-size", str(CHUNK), "--throttle", "read.total=2M", "-q"]
        s = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(lambda: "opened" in rx.stderr(), 20)
        time.sleep(1.0)
        os.kill(s.pid, signal.SIGKILL)
        s.wait(10)
        code, _, err = run_cli("transfer", src, f"{rx.dest}/job", "--secret-file", secret, "--no-lock",
                               "--chunk-size", str(CHUNK))
        assert code == 0, err
        assert trees_identical(src, str(root / "job"))[0]
    finally:
        rx.stop()
    assert rx.stderr().count("takes over files of older session") == 1, rx.stderr()


def test_space_refusal_leaves_no_empty_tree(tmp_path):
    mnt = tmp_path / "small"
    with tmpfs(str(mnt), "2m"):
        src = tmp_path / "src"
        for i in range(5):
            write_file(str(src / "a" / "b" / f"c{i}" / f"f{i}.bin"), 1 << 20, seed=i)
        (src / "empty-dir" / "deeper").mkdir(parents=True)
        code, s, err = run_cli("transfer", str(src), str(mnt / "dst"), "--json", "--no-lock")
        assert code == errors.FATAL and "not enough space" in err
        left = [dp for dp, _, _ in os.walk(mnt / "dst")]
        assert left == [str(mnt / "dst")], left


def test_a_vanished_source_file_leaves_no_partial(tmp_path):
    src = tmp_path / "src"
    write_file(str(src / "keep.bin"), 4 * CHUNK)
    write_file(str(src / "goes.bin"), 64 * CHUNK, seed=1)
    dst = tmp_path / "dst"
    p = subprocess.Popen([sys.executable, "-m", "automdt", "transfer", str(src), str(dst), "--json", "--no-lock",
                          "--threads", "1,1,1", "--chunk-size", str(CHUNK), "--throttle", "read.total=1M"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: dst.exists() and any(n.endswith(".part") for n in os.listdir(dst)), 20)
    time.sleep(0.5)
    (src / "goes.bin").unlink()
    out, err = p.communicate(timeout=60)
    assert p.returncode == errors.SOURCE_CHANGED, err
    assert err.count("goes.bin") == 1  # said once
    assert temporaries(str(dst)) == [] and sorted(os.listdir(dst)) == ["keep.bin"]


# ------------------------------------------------------------------------------ operators
def test_default_lock_directory_cannot_shadow_the_package(tmp_path):
    env = dict(os.environ)
    env["XDG_RUNTIME_DIR"] = ""  # unset: the lock goes to the temp directory
    env["TMPDIR"] = str(tmp_path)
    src = _tree(tmp_path, 1, 10)
    code, _, err = run_cli("transfer", src, str(tmp_path / "dst"), env=env)
    assert code == 0, err
    made = [n for n in os.listdir(tmp_path) if n.startswith("automdt")]
    assert made == [f"automdt-locks-{os.geteuid()}"], made
    # a Python session started there imports the real package, and the shipped policy loads
    r = subprocess.run([sys.executable, "-c", "import automdt, automdt.agents; print(automdt.__file__); "
                        "print(automdt.agents.make_policy('ppo', 32).name)"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert not r.stdout.splitlines()[0].startswith(str(tmp_path))


def test_quiet_cron_runs_say_nothing_unless_something_failed(tmp_path):
    src = _tree(tmp_path, 2, 32 * CHUNK)
    summ = tmp_path / "s.json"
    logf = tmp_path / "run.log"
    code, _, err = run_cli("transfer", src, str(tmp_path / "dst"), "--quiet", "--max-duration", "0.5",
                           "--throttle", "read.total=1M", "--chunk-size", str(CHUNK), "--summary-file", str(summ),
                           "--log-file", str(logf), "--no-lock")
    assert code == errors.MAX_DURATION and err == ""
    assert json.loads(summ.read_text())["exit_code"] == errors.MAX_DURATION
    assert "max-duration reached" in logf.read_text()
    code, _, err = run_cli("transfer", str(tmp_path / "nope"), str(tmp_path / "dst"), "--quiet", "--no-lock")
    assert code == errors.DIR_NOT_FOUND and err.count("\n") == 1 and "nope" in err


def test_summary_is_never_lost_when_its_directory_goes_away(tmp_path):
    src = _tree(tmp_path, 2, 32 * CHUNK)
    out_dir = tmp_path / "reports"
    out_dir.mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "automdt", "transfer", src, str(tmp_path / "dst"), "-q", "--no-lock",
                          "--threads", "1,1,1", "--chunk-size", str(CHUNK), "--throttle", "read.total=2M",
                          "--summary-file", str(out_dir / "run.json")],
                         cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: (tmp_path / "dst").exists(), 30)  # checked, and moving data
    time.sleep(0.5)
    shutil.rmtree(out_dir)  # e.g. a cleanup job, or a full disk
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    saved = [n for n in os.listdir(work) if n.startswith("run-") and n.endswith(".json")]
    assert len(saved) == 1 and f"written to {work / saved[0]} instead" in err
    assert json.loads((work / saved[0]).read_text())["files_transferred"] == 2


def test_json_into_a_closed_pipe(tmp_path):
    src = _tree(tmp_path, 3, 10)
    cmd = (f"{sys.executable} -m automdt transfer {src} {tmp_path / 'dst'} --json --no-lock --threads 1,1,1 "
           f"--summary-file {tmp_path / 's.json'} | head -c 20; echo \" ${{PIPESTATUS[0]}}\"")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert r.stdout.split()[-1] == "0", r.stdout + r.stderr
    assert r.stderr == "", r.stderr  # no "internal error: BrokenPipeError", no "Exception ignored"
    assert json.loads((tmp_path / "s.json").read_text())["exit_code"] == 0


def test_dry_run_text_lists_what_would_move(tmp_path):
    src = _tree(tmp_path, 3, 1000)
    dst = tmp_path / "dst"
    code, _, err = run_cli("transfer", src, str(dst), "--no-lock", "--threads", "1,1,1")
    assert code == 0
    write_file(os.path.join(src, "new", "n.bin"), 5000, seed=9)
    p = _popen("transfer", src, str(dst), "--dry-run", "--no-lock", "--threads", "1,1,1")
    assert p.returncode == 0, p.stderr
    assert "would send: new/n.bin" in p.stdout
    assert "dry run: would send 1 file (4.9 KiB); 3 of 4 files already complete" in p.stdout
    assert not (dst / "new").exists()


def test_unreachable_loopback_receiver_fails_at_once(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    src = _tree(tmp_path, 1, 10)
    t0 = time.monotonic()
    code, summ, err = run_cli("transfer", src, f"127.0.0.1:{port}/x", "--json", "--no-lock")
    took = time.monotonic() - t0
    assert code == errors.NETWORK and summ["attempts"] == 1, (summ, err)
    assert "connection refused" in err and took < 5, took


def test_encrypt_mismatch_is_fatal_at_once(tmp_path):
    src = _tree(tmp_path, 1, 10)
    secret = _secret(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    rx = ReceiverProc(str(root), secret, str(tmp_path), extra=["--encrypt"])
    try:
        rx.start()
        t0 = time.monotonic()
        code, summ, err = run_cli("transfer", src, f"{rx.dest}/x", "--secret-file", secret, "--json", "--no-lock")
        assert code == errors.FATAL and summ["attempts"] == 1 and "requires --encrypt" in err
        assert time.monotonic() - t0 < 5
    finally:
        rx.stop()


def test_a_policy_of_ones_own_from_the_cli(tmp_path):
    mod = tmp_path / "mylab_amdt_i12.py"
    mod.write_text("class Fixed:\n    name = 'fixed-3-2-1'\n    def __init__(self, max_threads):\n"
                   "        self.t = (3, 2, 1)\n    def reset(self, max_threads, seed=None):\n        return self.t\n"
                   "    def act(self, obs):\n        return self.t\n")
    src = _tree(tmp_path, 2, 8 * CHUNK)
    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    code, s, err = run_cli("transfer", src, str(tmp_path / "dst"), "--json", "--no-lock",
                           "--policy", "mylab_amdt_i12:Fixed", env=env)
    assert code == 0, err
    assert s["threads"] == {"read": 3, "net": 2, "write": 1}
    code, _, err = run_cli("transfer", src, str(tmp_path / "dst"), "--no-lock", "--policy", "mylab_amdt_i12:Nope",
                           env=env)
    assert code == errors.USAGE and "has no 'Nope'" in err


def test_train_says_when_the_time_budget_misses_the_target(tmp_path):
    from automdt.simulator.profile import Profile

    Profile.default().save(tmp_path / "p.yaml")
    p = _popen("train", "--profile", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "pol.zip"), "--target", "1.0",
               "--max-seconds", "1", "--no-progress", timeout=300)
    assert p.returncode == 0, p.stderr
    assert "target missed" in p.stderr and "--max-seconds 1 ran out" in p.stderr
    assert "NOT reached" in p.stdout and (tmp_path / "pol.zip").exists()


# --------------------------------------------------------------------------------- display
def test_progress_line_fits_any_width_in_binary_units():
    from automdt.display import progress_line

    for width in range(20, 201, 7):
        line = progress_line("transfer", 12_345_678, 53_000_003, 19.9e6, (2, 12, 3), "2/4", width)
        assert len(line) <= width and "MiB" in line and " MB" not in line
    assert "19.0 MiB/s" in progress_line("transfer", 1, 2, 19.9e6, (1, 1, 1), "0/1", 80)


def test_progress_display_on_a_60_column_terminal(tmp_path):
    import pty

    src = _tree(tmp_path, 4, 32 * CHUNK)
    script = ("import fcntl, os, struct, sys, termios\n"
              "fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 60, 0, 0))\n"
              "os.environ.pop('COLUMNS', None)\n"
              "from automdt.cli import main\n"
              f"sys.exit(main(['transfer', {src!r}, {str(tmp_path / 'dst')!r}, '--no-lock', '--threads', '2,2,2',"
              f" '--chunk-size', '{CHUNK}', '--throttle', 'read.total=4M']))\n")
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-c", script])
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            d = os.read(fd, 65536)
        except OSError:
            break
        if not d:
            break
        out += d
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out[-500:]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
    frames = [f for f in re.split(r"[\r\n]", text) if f.strip()]
    progress = [f for f in frames if "MiB/s" in f and "transferred" not in f]
    assert progress, frames
    assert all(len(f) <= 60 for f in progress), max(progress, key=len)
    assert not any(re.search(r"\d MB/s", f) for f in frames)
    assert any(re.match(r"\d+ transferred, .* MiB/s\); exit 0$", f) for f in frames), frames[-3:]


# ------------------------------------------------------------------------------------ docs
# The CLI reference and the exit codes page are generated from the parser and automdt.errors;
# tests/docs/test_cli_docs.py holds the README and the docs to them. The help texts are that
# reference's source, so every option needs one.
def test_every_option_has_help_text():
    import argparse

    from automdt.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    bare = [f"{cmd} {a.dest}" for cmd, p in sub.choices.items() for a in p._actions
            if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not bare, f"options and arguments without a --help description: {bare}"


# ------------------------------------------------------------------ no "internal error" anywhere
def _odd_world(tmp_path):
    import socket
    import threading

    w = {"tmp": tmp_path}
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.bin").write_bytes(os.urandom(3000))
    (src / "a.txt").write_text("a")
    w["src"] = str(src)
    (tmp_path / "empty-src").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "plain").write_text("not a directory")
    dst = tmp_path / "dst-with-file"
    dst.mkdir()
    (dst / "sub").write_text("a file where the source has a directory")
    (tmp_path / "list.yaml").write_text("[1, 2, 3]\n")
    (tmp_path / "binary.yaml").write_bytes(os.urandom(300))
    (tmp_path / "neg.yaml").write_text("stages:\n  read: {tpt: -1, bandwidth: 5}\n  net: {tpt: 1, bandwidth: 5}\n"
                                       "  write: {tpt: 1, bandwidth: 5}\n")
    (tmp_path / "garbage.zip").write_bytes(b"PK\x03\x04 not really a zip")
    os.chmod(tmp_path / "garbage.zip", 0o600)
    secret = tmp_path / "secret"
    secret.write_text("x-secret\n")
    secret.chmod(0o600)
    w["secret"] = str(secret)
    # a TCP service that is not an automdt receiver: it answers with junk, then hangs up
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            try:
                c.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            except OSError:
                pass
            c.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    w["junk_port"] = srv.getsockname()[1]
    w["close"] = lambda: (stop.set(), th.join(5), srv.close())
    busy = socket.create_server(("127.0.0.1", 0))
    w["busy_port"], w["busy"] = busy.getsockname()[1], busy
    return w


ODD = [
    ("transfer", "{src}", "{tmp}/plain"),  # the destination is a file
    ("transfer", "{tmp}/fifo", "{tmp}/d1"),  # the source is a fifo
    ("transfer", "{tmp}/empty-src", "{tmp}/d2", "--json"),
    ("transfer", "{src}", "{tmp}/dst-with-file"),  # a file where the source has a directory
    ("transfer", "{src}", "127.0.0.1:{junk_port}/x", "--retries", "0", "--timeout", "2"),  # not a receiver
    ("transfer", "{src}", "{tmp}/d3", "--policy", "{tmp}/garbage.zip"),
    ("transfer", "{src}", "{tmp}/d3", "--policy", "os.path:join"),
    ("transfer", "{src}", "{tmp}/d4", "--throttle", "@{tmp}/binary.yaml"),
    ("verify", "{src}", "{tmp}/nowhere"),
    ("verify", "{src}", "{tmp}/plain"),
    ("simulate", "--profile", "{tmp}/list.yaml"),
    ("simulate", "--profile", "{tmp}/binary.yaml"),
    ("simulate", "--profile", "{tmp}/neg.yaml"),
    ("simulate", "--profile", "{tmp}/list.yaml", "--policy", "{tmp}/garbage.zip"),
    ("train", "--profile", "{tmp}/neg.yaml", "-o", "{tmp}/p.zip"),
    ("explore", "{tmp}/empty-src", "{tmp}/xd", "-o", "{tmp}/e.yaml", "--duration", "3"),
    ("receive", "--listen", "127.0.0.1:{busy_port}", "--root", "{tmp}"),
    ("receive", "--listen", "127.0.0.1:0", "--root", "{tmp}/nowhere"),
    ("receive", "--listen", "192.0.2.1:0", "--root", "{tmp}", "--secret-file", "{secret}"),  # not this host's
    ("transfer",),
    (),
]


def test_no_user_reachable_path_prints_internal_error(tmp_path):
    """Odd but possible inputs: each ends with documented exit codes and `automdt: ` lines only.
    (Every other CLI run of the suite checks the same through tests.util.run_cli.)"""
    from automdt.errors import EXIT_CODES

    w = _odd_world(tmp_path)
    try:
        for case in ODD:
            argv = [a.format(**w) for a in case]
            p = _popen(*argv, timeout=60)
            what = f"automdt {' '.join(argv)}: exit {p.returncode}: {p.stderr!r}"
            assert "internal error" not in p.stderr and "Traceback" not in p.stderr, what
            assert p.returncode in EXIT_CODES and (p.returncode != 0 or argv[:1] == ["transfer"]), what
            errs = [ln for ln in p.stderr.splitlines() if ln.strip()]
            assert all(ln.startswith(("automdt: ", "usage: ")) for ln in errs), what
    finally:
        w["close"]()
        w["busy"].close()
