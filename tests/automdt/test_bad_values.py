"""Every subcommand, every option, bad values: one line on stderr, exit 2, no traceback, nothing done.

The table :data:`BAD` must name every option that takes a value in every subcommand (the
completeness test reads the parser), so an option added without a bad-value case fails here.
The cases run in-process through ``automdt.cli.main`` (the code a user's process runs; fast
because validation must fail before any work starts) except ``receive``, which would serve
forever on a value wrongly accepted and so runs as real processes with a timeout; a sample of
the other cases runs as real processes too.
"""
import argparse
import os
import subprocess
import sys
import time

import pytest

from automdt import errors
from automdt.cli import build_parser, main

NOFILE = "/nonexistent-amdt-i12/x"
PROCFILE = "/proc/amdt-i12-nowrite/x"  # nothing can be created under /proc, even by root
DIR = "<DIR>"  # an existing directory (where a file is expected)
PLAIN = "<PLAIN>"  # an existing regular file (where a directory is expected)
OPEN_SECRET = "<OPEN_SECRET>"  # a secret file of mode 644
EMPTY_SECRET = "<EMPTY_SECRET>"
BAD_YAML = "<BAD_YAML>"  # a profile file that is not a profile

INT0 = ["-1", "x", "2.5", ""]
INT1 = ["0", "-3", "x", "1.5", ""]
SECONDS_POS = ["0", "-5", "x", "nan", "inf", ""]
SECONDS_NONNEG = ["-1", "x", "nan", ""]
THREADS = ["0,1,1", "1,1", "a,b,c", "-1,2,2", ""]
OUT_FILE = [NOFILE, PROCFILE, DIR, ""]
IN_FILE = [NOFILE, DIR, ""]
SECRET = IN_FILE + [OPEN_SECRET, EMPTY_SECRET]
PROFILE = IN_FILE + [BAD_YAML, PLAIN]
SWITCH = ["sendfile=2", "nope=1", "files_at_once=99", "local_link", ""]

ENGINE = {
    "--threads": THREADS + ["40,1,1"],  # above --max-threads 32
    "--memory": ["0", "-1", "x", "5Q", "1K", "1T", ""],
    "--chunk-size": ["0", "-1", "x", "1K", "128Mi", ""],
    "--throttle": ["read.thread=x", "disk.total=1M", "read", "read.thread=-5", "@" + NOFILE, "@"],
    "--secret-file": SECRET,
    "--max-threads": ["0", "-1", "x", "5000", ""],
    "--interval": ["0", "-1", "x", "0.01", "nan", ""],
    "--log": OUT_FILE,
    "--sndbuf": ["-1", "x", "3Gi", ""],
    "--switch": SWITCH,
}
OPS = {
    "--lock-file": [PROCFILE, DIR, ""],
    "--lock-wait": SECONDS_NONNEG,
    "--summary-file": OUT_FILE,
    "--log-file": OUT_FILE,
}
BAD = {
    "transfer": {**ENGINE, **OPS, "--shard": ["3/2", "x", "1/0", "-1/2", ""], "--metrics-file": OUT_FILE,
                 "--metrics-job": [""],
                 "--policy": ["bogus", "static:0,1,1", "oracle", "nosuch_mod_amdt_i12:Policy", "ppo:/nonexistent.zip", ""],
                 "--max-duration": SECONDS_POS, "--fsync": ["sometimes"], "--chunk-retries": INT0 + ["5000"],
                 "--retries": INT0 + ["5000"], "--retries-sleep": SECONDS_NONNEG, "--timeout": SECONDS_POS + ["0.5"],
                 "--bwlimit": ["-1", "x", ""]},
    "verify": {"--secret-file": SECRET, "--chunk-size": ["0", "-1", "x", "1K", "128Mi", ""],
               "--timeout": SECONDS_POS},
    "receive": {"--listen": ["x", "127.0.0.1:99999", "127.0.0.1:x", ""], "--root": [PLAIN, ""],
                "--secret-file": SECRET, "--max-threads": ["0", "-1", "x", ""],
                "--max-memory": ["0", "-1", "x", "1K", ""], "--idle-timeout": SECONDS_POS, "--log-file": OUT_FILE,
                "--metrics": ["x", "127.0.0.1:99999", ""], "--max-sessions": ["0", "-1", "x", ""],
                "--total-memory": ["0", "-1", "x", "1K", ""], "--total-threads": ["0", "-1", "x", ""],
                "--total-connections": ["0", "-1", "x", ""],
                "--throttle": ["write.thread=x", "disk.total=1M", "write", "write.total=-5", "read.total=1M",
                               "net.thread=1M,write.total=1M"],
                "--switch": SWITCH},
    "demo": {"--dir": [PROCFILE, PLAIN, ""], "--size": ["0", "-1", "x", "1K", ""], "--threads": THREADS},
    "explore": {**{k: v for k, v in ENGINE.items() if k != "--threads"}, "--duration": SECONDS_POS + ["1"], "-o": OUT_FILE, "--seed": ["-1", "x", ""]},
    "train": {"--profile": PROFILE, "-o": OUT_FILE, "--timesteps": INT1, "--seed": ["-1", "x", ""],
              "--target": ["0", "1.5", "-1", "x", ""], "--max-seconds": SECONDS_POS, "--k": ["0", "0.5", "3", "x", ""],
              "--tensorboard": [PROCFILE, PLAIN, ""]},
    "simulate": {"--profile": PROFILE,
                 "--policy": ["bogus", "static:0,1,1", "nosuch_mod_amdt_i12:Policy", "ppo:/nonexistent.zip", ""],
                 "--steps": INT1 + ["2000000"], "--seed": ["-1", "x", ""], "--k": ["0", "0.5", "3", "x", ""]},
    "tune": {"--storage": ["garbage", f"journal:{NOFILE}", ""], "--study-name": [""], "--trials": INT1,
             "--timesteps": INT1, "--profile": PROFILE, "--k": ["0", "0.5", "3", "x", ""], "--seed": ["-1", "x", ""],
             "--sampler-seed": ["-1", "x", ""], "--startup-trials": ["-1", "x", ""], "--timeout": SECONDS_POS,
             "--trial-seconds": SECONDS_POS, "--keep": [NOFILE, PLAIN, ""]},
    "exit-codes": {},
}


def _value_options(parser: argparse.ArgumentParser):
    """{subcommand: [option string]} of every option that takes a value."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, p in sub.choices.items():
        out[name] = sorted(a.option_strings[-1] if a.option_strings[-1].startswith("--") and len(a.option_strings) == 1
                           else max(a.option_strings, key=len) if not any(o == "-o" for o in a.option_strings) else "-o"
                           for a in p._actions
                           if a.option_strings and a.nargs != 0 and not isinstance(a, argparse._HelpAction))
    return out


def test_every_value_option_has_bad_value_cases():
    opts = _value_options(build_parser())
    assert set(opts) == set(BAD), "a subcommand without bad-value cases"
    for cmd, names in opts.items():
        assert sorted(BAD[cmd]) == names, f"{cmd}: options without bad-value cases, or stale ones"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("amdt-i12-bad")
    src = d / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(5000))
    (src / "sub" / "b.txt").write_text("b")
    (d / "plain").write_text("a file, not a directory")
    (d / "open-secret").write_text("secret\n")
    os.chmod(d / "open-secret", 0o644)
    (d / "empty-secret").write_text("")
    os.chmod(d / "empty-secret", 0o600)
    (d / "bad.yaml").write_text("stages: [1, 2\n: nonsense")
    from automdt.simulator.profile import Profile

    Profile.default().save(d / "profile.yaml")
    return d


def _subst(v, world):
    return {DIR: str(world), PLAIN: str(world / "plain"), OPEN_SECRET: str(world / "open-secret"),
            EMPTY_SECRET: str(world / "empty-secret"), BAD_YAML: str(world / "bad.yaml")}.get(v, v)


def _base(cmd, world, out):
    """Valid arguments of ``cmd`` that would do (little) real work if nothing else were wrong."""
    src = str(world / "src")
    return {
        "transfer": [src, str(out / "dst"), "--dry-run"],
        "verify": [src, str(out / "dst")],
        "receive": ["--listen", "127.0.0.1:0", "--root", str(out)],
        "demo": ["--dir", str(out / "demo"), "--size", "1Mi", "--threads", "1,1,1"],
        "explore": [src, str(out / "dst"), "-o", str(out / "p.yaml"), "--duration", "3"],
        "train": ["-o", str(out / "p.zip"), "--timesteps", "64", "--profile", str(world / "profile.yaml")],
        "simulate": ["--profile", str(world / "profile.yaml"), "--steps", "2"],
        "tune": ["--storage", f"journal:{out}/study.log", "--study-name", "amdt-i12", "--trials", "1",
                 "--timesteps", "64"],
        "exit-codes": [],
    }[cmd]


CASES = [(cmd, opt, v) for cmd, table in BAD.items() for opt, vals in table.items() for v in vals]


def _check_one_line_usage_error(code, out, err, what):
    assert code == errors.USAGE, f"{what}: exit {code}, stderr {err!r}"
    assert "Traceback" not in err and "internal error" not in err, what
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("automdt: "), f"{what}: {err!r}"
    assert out == "", f"{what}: stdout {out!r}"


@pytest.mark.parametrize("cmd,opt,value", [c for c in CASES if c[0] != "receive"],
                         ids=[f"{c}{o}={v or 'empty'}" for c, o, v in CASES if c != "receive"])
def test_bad_value_is_one_line_exit_2_before_any_work(cmd, opt, value, world, tmp_path, capsys, monkeypatch):
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    argv = [cmd, *_base(cmd, world, tmp_path), opt, _subst(value, world)]
    t0 = time.monotonic()
    code = main(argv)
    took = time.monotonic() - t0
    out, err = capsys.readouterr()
    _check_one_line_usage_error(code, out, err, " ".join(argv))
    # nothing was started: no destination, output, lock or dataset
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runtime"], f"{argv}: left {list(tmp_path.iterdir())}"
    assert list(runtime.iterdir()) == []
    assert took < 10, f"{argv}: {took:.1f} s before failing"


@pytest.mark.parametrize("opt,value", [(o, v) for c, o, v in CASES if c == "receive"])
def test_receive_bad_value_is_one_line_exit_2(opt, value, world, tmp_path):
    argv = ["receive", *_base("receive", world, tmp_path), opt, _subst(value, world)]
    p = subprocess.run([sys.executable, "-m", "automdt", *argv], capture_output=True, text=True, timeout=30)
    _check_one_line_usage_error(p.returncode, p.stdout, p.stderr, " ".join(argv))


@pytest.mark.parametrize("argv", [
    ["transfer", "SRC", "DST", "--retries", "-1"],
    ["transfer", "SRC", "DST", "--summary-file", NOFILE],
    ["transfer", "SRC", "DST", "--log-file", NOFILE, "--debug"],
    ["explore", "SRC", "DST", "-o", NOFILE],
    ["simulate", "--profile", "PROFILE", "--steps", "0"],
    ["transfer", "SRC", "127.0.0.1:7/../../etc"],
])
def test_bad_values_in_real_processes(argv, world, tmp_path):
    """The same through the `automdt` process a user starts (also: --debug after the subcommand)."""
    argv = [{"SRC": str(world / "src"), "DST": str(tmp_path / "dst"), "PROFILE": str(world / "profile.yaml")}.get(a, a)
            for a in argv]
    p = subprocess.run([sys.executable, "-m", "automdt", *argv], capture_output=True, text=True, timeout=60)
    _check_one_line_usage_error(p.returncode, p.stdout, p.stderr, " ".join(argv))
    assert not (tmp_path / "dst").exists()


def test_debug_is_accepted_after_the_subcommand(world, tmp_path, capsys):
    code = main(["exit-codes", "--debug"])
    assert code == 0 and "130" in capsys.readouterr().out
    code = main(["transfer", str(world / "src"), str(tmp_path / "d"), "--threads", "1,1,1", "--no-lock", "--json",
                 "--debug"])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("argv", [["bottlenecks", "--duration", "-5"], ["bottlenecks", "--seed", "x"],
                                  ["cost", "--memory", "0"], ["convergence", "--own-target", "2"],
                                  ["completion", "--rate", "0"], ["bottlenecks", "--max-threads", "0"],
                                  ["bottlenecks", "--interval", "nan"], ["nosuch"]])
def test_experiments_bad_values(argv, capsys):
    from automdt.experiments.run import main as experiments_main

    with pytest.raises(SystemExit) as e:
        experiments_main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("python -m automdt.experiments: "), err


@pytest.mark.parametrize("name", ["bottlenecks", "convergence", "completion", "fairness", "cost", "all"])
def test_each_experiment_has_its_own_help(name, capsys):
    from automdt.experiments.run import EXPERIMENT_HELP, main as experiments_main

    assert experiments_main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m automdt.experiments {name} ")
    assert " ".join(EXPERIMENT_HELP[name].split())[:60] in " ".join(out.split())
