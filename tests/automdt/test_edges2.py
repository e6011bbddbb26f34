"""What a new user's first hour still met: destinations written as hosts that are none, permission
problems at the destination, and the small wording slips. Real processes, files and loopback
receivers; an unprivileged user is ``nobody`` (os.setuid in the child, when the tests run as root)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from tests.util import trees_identical, write_file  # noqa: E402


def _src(tmp_path):
    src = tmp_path / "src"
    write_file(str(src / "a.bin"), 3000, seed=1)
    write_file(str(src / "sub" / "b.bin"), 5000, seed=2)
    return str(src)


def _drop_to(user):
    """``(argv prefix, preexec_fn)`` that run a child as ``user``: ``os.setuid`` in the child, or,
    where the interpreter lies in a directory only root may search (a pyenv under /root), util-linux
    ``setpriv`` (which can exec it); skips the test when neither runs Python."""
    import shutil

    def pre():
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    ways = [([], pre)]
    if shutil.which("setpriv"):
        ways.append((["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"], None))
    for prefix, fn in ways:
        try:
            if subprocess.run([*prefix, sys.executable, "-c", "pass"], preexec_fn=fn, timeout=30).returncode == 0:
                return prefix, fn
        except OSError:
            continue
    pytest.skip(f"cannot run {sys.executable} as {user.pw_name} (neither os.setuid nor setpriv)")


def _cli(*args, cwd=None, user=None, timeout=60, log_to=None):
    """``python -m automdt ARGS`` (as ``user``, a pwd entry, when given): the CompletedProcess, or
    with ``log_to`` (a file for its stderr) the running Popen."""
    prefix, pre = _drop_to(user) if user is not None else ([], None)
    env = dict(os.environ)
    if user is not None:
        env["HOME"] = "/nonexistent"
    argv = [*prefix, sys.executable, "-m", "automdt", *args]
    if log_to is not None:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log_to, cwd=cwd, preexec_fn=pre, env=env)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, preexec_fn=pre, env=env)
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
    return p


# ------------------------------------------------------------------------------ DEST parsing
@pytest.mark.parametrize("dest,hint", [
    ("127.0.0.1:/run13", "127.0.0.1:5000/run13"),  # scp's HOST:/PATH, no port
    ("localhost:5077:run13", "did you mean localhost:5077/run13?"),
    ("dtn-in:run13", "dtn-in:5000/run13"),
    ("[::1]:/x", "no port"),
])
@pytest.mark.parametrize("cmd", ["transfer", "verify"])
def test_a_host_written_wrong_is_a_usage_error_and_creates_nothing(tmp_path, cmd, dest, hint):
    src = _src(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    p = _cli(cmd, src, dest, cwd=work)
    assert p.returncode == errors.USAGE, (p.returncode, p.stderr)
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and hint in line and f"./{dest}" in line, line
    assert os.listdir(work) == []  # nothing created where an scp habit would have written


def test_a_colon_name_is_local_with_a_dot_slash(tmp_path):
    src = _src(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    for dest in ("./127.0.0.1:run13", "./host:5000"):
        p = _cli("transfer", src, dest, "--threads", "1,1,1", cwd=work)
        assert p.returncode == 0, p.stderr
        ok, diff = trees_identical(src, str(work / dest[2:]))
        assert ok, diff


def test_an_existing_directory_named_like_an_address_is_still_an_address(tmp_path):
    """host:PORT is always the receiver (as rsync's host:path is always remote): a directory that
    happens to have the name never turns a remote job into a local copy."""
    src = _src(tmp_path)
    work = tmp_path / "cwd"
    (work / "127.0.0.1:9").mkdir(parents=True)
    p = _cli("transfer", src, "127.0.0.1:9", "--retries", "0", cwd=work)
    assert p.returncode == errors.NETWORK, p.stderr
    assert os.listdir(work / "127.0.0.1:9") == []


# ------------------------------------------------------------------------------ permissions
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to an unprivileged user needs root")


@pytest.fixture
def world(tmp_path):
    """A directory every user can enter (pytest's own temp directory is its owner's alone), with
    state and runtime directories ``nobody`` can write; removed afterwards."""
    import pwd
    import shutil
    import tempfile

    base = tempfile.mkdtemp(prefix="amdt-edges2-", dir="/tmp")
    os.chmod(base, 0o755)
    for d in ("state", "runtime"):
        os.mkdir(os.path.join(base, d))
        os.chmod(os.path.join(base, d), 0o777)
    src = os.path.join(base, "src")
    write_file(os.path.join(src, "a.bin"), 3000, seed=1)
    write_file(os.path.join(src, "sub", "b.bin"), 5000, seed=2)
    for dp, dns, fns in os.walk(src):
        for n in dns:
            os.chmod(os.path.join(dp, n), 0o755)
        for n in fns:
            os.chmod(os.path.join(dp, n), 0o644)
    os.chmod(src, 0o755)
    try:
        yield {"base": base, "src": src, "nobody": pwd.getpwnam("nobody")}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as_nobody(w, *args, **kw):
    env = {"XDG_STATE_HOME": os.path.join(w["base"], "state"), "XDG_RUNTIME_DIR": os.path.join(w["base"], "runtime")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the test session's own are root's alone
    try:
        return _cli(*args, user=w["nobody"], **kw)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _dir(w, name, mode, owner=None):
    p = os.path.join(w["base"], name)
    os.makedirs(p, exist_ok=True)
    if owner is not None:
        os.chown(p, owner.pw_uid, owner.pw_gid)
    os.chmod(p, mode)
    return p


@needs_root
def test_an_unwritable_destination_is_exit_3_with_its_path(world):
    w = world
    ro = _dir(w, "noperm", 0o555)
    p = _as_nobody(w, "transfer", w["src"], ro, "--threads", "1,1,1")
    assert p.returncode == errors.DIR_NOT_FOUND, p.stderr
    assert f"destination {ro}: not writable: Permission denied" in p.stderr, p.stderr
    assert "receiver:" not in p.stderr  # a local destination: no receiver the user started
    assert os.listdir(ro) == []
    p = _as_nobody(w, "transfer", w["src"], os.path.join(ro, "x"), "--threads", "1,1,1")
    assert p.returncode == errors.DIR_NOT_FOUND and os.path.join(ro, "x") in p.stderr, p.stderr


@needs_root
def test_an_unwritable_subdirectory_fails_its_files_with_their_paths(world):
    w = world
    dst = _dir(w, "dst", 0o755, owner=w["nobody"])
    sub = _dir(w, "dst/sub", 0o555)  # root's: nobody cannot create in it
    p = _as_nobody(w, "transfer", w["src"], dst, "--threads", "1,1,1")
    assert p.returncode == errors.FILES_FAILED, p.stderr
    assert f"sub/b.bin: cannot write it in {sub}: Permission denied" in p.stderr, p.stderr
    assert os.path.exists(os.path.join(dst, "a.bin"))
    # every file failing is exit 6 too (not 0 with "1 failed" and no reason)
    only = os.path.join(w["base"], "only-sub")
    os.makedirs(os.path.join(only, "sub"))
    write_file(os.path.join(only, "sub", "b.bin"), 10, seed=3)
    os.chmod(os.path.join(only, "sub", "b.bin"), 0o644)
    for d in (only, os.path.join(only, "sub")):
        os.chmod(d, 0o755)
    p = _as_nobody(w, "transfer", only, dst, "--threads", "1,1,1")
    assert p.returncode == errors.FILES_FAILED and "sub/b.bin" in p.stderr, (p.returncode, p.stderr)


@needs_root
def test_a_directory_that_cannot_be_created_is_named(world):
    w = world
    dst = _dir(w, "dst2", 0o755, owner=w["nobody"])
    nested = os.path.join(w["base"], "nested")
    write_file(os.path.join(nested, "top.bin"), 10, seed=4)
    write_file(os.path.join(nested, "a", "b", "f.bin"), 10, seed=5)
    for dp, dns, fns in os.walk(nested):
        os.chmod(dp, 0o755)
        for n in fns:
            os.chmod(os.path.join(dp, n), 0o644)
    a = _dir(w, "dst2/a", 0o555)
    p = _as_nobody(w, "transfer", nested, dst, "--threads", "1,1,1")
    assert p.returncode == errors.FILES_FAILED, p.stderr
    assert f"a/b: cannot create directory {a}/b: Permission denied" in p.stderr, p.stderr
    assert os.path.exists(os.path.join(dst, "top.bin"))


@needs_root
def test_receive_refuses_a_root_it_cannot_write_at_start(world):
    w = world
    ro = _dir(w, "rroot", 0o555)
    p = _as_nobody(w, "receive", "--listen", "127.0.0.1:0", "--root", ro, timeout=30)
    assert p.returncode == errors.DIR_NOT_FOUND, p.stderr
    assert p.stderr.strip() == f"automdt: --root {ro}: not writable by nobody: Permission denied", p.stderr


def test_receive_says_a_missing_root_is_missing(tmp_path):
    p = _cli("receive", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "nowhere"), timeout=30)
    assert p.returncode == errors.DIR_NOT_FOUND
    assert p.stderr.strip() == f"automdt: --root {tmp_path / 'nowhere'}: no such directory", p.stderr


@needs_root
def test_the_receiver_logs_every_refused_session_with_its_reason(world):
    from tests.faults.helpers import free_port, wait_for

    w = world
    nobody = w["nobody"]
    root = _dir(w, "recv", 0o755, owner=nobody)
    ro = _dir(w, "recv/ro", 0o555)  # root's
    with open(os.path.join(root, "afile"), "w") as f:
        f.write("a file where a subdirectory is asked for")
    secret = os.path.join(w["base"], "secret")
    with open(secret, "w") as f:
        f.write("s3cret-of-the-receiver\n")
    os.chown(secret, nobody.pw_uid, nobody.pw_gid)
    os.chmod(secret, 0o600)
    mine = os.path.join(w["base"], "mine")  # the senders' (root's) copy of the secret
    with open(mine, "w") as f:
        f.write("s3cret-of-the-receiver\n")
    os.chmod(mine, 0o600)
    wrong = os.path.join(w["base"], "wrong")
    with open(wrong, "w") as f:
        f.write("not-the-secret\n")
    os.chmod(wrong, 0o600)

    port = free_port()
    errpath = os.path.join(w["base"], "receiver.err")

    def log():
        with open(errpath) as f:
            return f.read()

    with open(errpath, "w") as err:
        rx = _as_nobody(w, "receive", "--listen", f"127.0.0.1:{port}", "--root", root, "--secret-file", secret,
                        log_to=err)
    try:
        assert wait_for(lambda: "receiving into" in log() or rx.poll() is not None, 20), log()
        assert rx.poll() is None, log()
        dest = f"127.0.0.1:{port}"
        cases = [  # (dest, secret file, exit code, what the sender says, what the receiver logs)
            (dest, None, errors.FATAL, "requires a shared secret", "the sender gave no secret"),
            (dest, wrong, errors.FATAL, "", "wrong secret"),
            (dest + "/ro", mine, errors.DIR_NOT_FOUND, f"destination {ro}: not writable: Permission denied",
             f"destination {ro}: not writable"),
            (dest + "/ro/new", mine, errors.DIR_NOT_FOUND, f"destination {ro}/new: cannot open or create it",
             f"destination {ro}/new: cannot open or create it"),
            (dest + "/afile", mine, errors.FILES_FAILED, "afile", "afile: is a symlink or not a directory"),
        ]
        for dst, sec, code, says, logged in cases:
            before = log().count(" refused: ")
            args = ["transfer", w["src"], dst, "--retries", "0", "--threads", "1,1,1", "--no-history"]
            p = _cli(*args, *(["--secret-file", sec] if sec else []))
            assert p.returncode == code, (dst, p.returncode, p.stderr)
            assert says in p.stderr, (dst, p.stderr)
            assert wait_for(lambda: log().count(" refused: ") == before + 1, 10), (dst, log())
            line = [ln for ln in log().splitlines() if " refused: " in ln][-1]
            assert logged in line and "from 127.0.0.1" in line, (dst, line)
        assert rx.poll() is None
        assert os.listdir(ro) == []
    finally:
        rx.terminate()
        rx.wait(10)


# ------------------------------------------------------------------------------ wording
def test_counts_are_singular_when_one_and_verify_speaks_in_text(tmp_path):
    src = tmp_path / "one"
    write_file(str(src / "only.bin"), 100, seed=3)
    p = _cli("transfer", str(src), str(tmp_path / "dst"), "-n", "--threads", "1,1,1")
    assert p.returncode == 0, p.stderr
    assert "dry run: would send 1 file (100 B); 0 of 1 file already complete" in p.stdout, p.stdout
    p = _cli("transfer", _src(tmp_path), str(tmp_path / "dst2"), "--verify", "--threads", "1,1,1")
    assert p.returncode == 0, p.stderr
    assert "verify: 2 of 2 files identical by content digest on both ends" in p.stdout, p.stdout


@pytest.mark.parametrize("argv,said", [
    (["transfer", "{src}", "{dst}", "--chunksize", "1M"],
     "automdt: transfer: unrecognized arguments: --chunksize 1M; did you mean --chunk-size? "
     "(see `automdt transfer --help`)"),
    (["transfer", "{src}", "{dst}", "--verfy=yes"], "did you mean --verify? (see `automdt transfer --help`)"),
    (["receive", "--listn", "127.0.0.1:0", "--root", "{dst}"],
     "automdt: receive: unrecognized arguments: --listn; did you mean --listen? (see `automdt receive --help`)"),
    (["tranfer", "{src}", "{dst}"], "did you mean 'transfer'? (see `automdt --help`)"),
    (["transfer", "{src}", "{dst}", "--fsync", "fil"], "did you mean 'file'? (see `automdt transfer --help`)"),
    (["verify", "{src}", "{dst}", "--xyzzy"],
     "automdt: verify: unrecognized arguments: --xyzzy (see `automdt verify --help`)"),
])
def test_an_option_typo_points_to_the_subcommand_and_the_closest_option(tmp_path, argv, said):
    src = _src(tmp_path)
    dst = tmp_path / "dst"
    p = _cli(*[a.format(src=src, dst=dst) for a in argv])
    assert p.returncode == errors.USAGE
    assert len(p.stderr.strip().splitlines()) == 1 and said in p.stderr, p.stderr
    assert not dst.exists()


def test_an_address_whose_host_does_not_resolve_hints_at_the_local_folder(tmp_path):
    """``backup:2024`` is a host and a port; when no such host resolves, the error says how to
    name a local directory of that name (nothing is created)."""
    src = _src(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    p = _cli("transfer", src, "no-such-host.invalid:2024", "--retries", "0", cwd=work)
    assert p.returncode == errors.NETWORK, p.stderr
    assert "for a local directory of that name write ./no-such-host.invalid:2024" in p.stderr, p.stderr
    assert os.listdir(work) == []
