"""What the README and the documentation say about the command line matches the parser.

The CLI reference and the man page are generated from ``automdt.cli.build_parser()`` and the exit
codes page from ``automdt.errors``; these tests hold the prose to the same sources: every
``automdt ...`` command shown parses, every ``--option`` named exists, every exit code named is
one ``automdt.errors`` defines, and the README's generated table is current.
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from automdt import errors
from automdt.cli import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = sorted([os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True),
                os.path.join(ROOT, "benchmarks", "README.md"), os.path.join(ROOT, "experiments", "README.md")])
PAGES = [p for p in PAGES if "_build" not in p]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")


def _subparsers(p: argparse.ArgumentParser):
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices
    return {}


def _options(p: argparse.ArgumentParser) -> set:
    found = set()
    for a in p._actions:
        found.update(s for s in a.option_strings if s.startswith("--"))
    for sub in _subparsers(p).values():
        found |= _options(sub)
    return found


def _script_options() -> set:
    """Options of the benchmark, experiment and helper scripts, read from their sources."""
    found = set()
    for path in glob.glob(os.path.join(ROOT, "benchmarks", "*.py")) + glob.glob(os.path.join(ROOT, "scripts", "*.py")) \
            + glob.glob(os.path.join(ROOT, "experiments", "*.py")):
        with open(path) as f:
            found.update(re.findall(r"add_argument\(\s*(?:\"-\w\",\s*)?\"(--[\w-]+)\"", f.read()))
    return found


# options of other programs the pages quote (rsync, iperf3, pip, ...), never automdt's
OTHER_TOOLS = {"--daemon", "--no-detach", "--whole-file", "--inplace", "--sys-prefix", "--no-deps",
               "--no-build-isolation", "--disable-pip-version-check", "--logdir", "--array", "--export", "--now",
               "--detach", "--help", "--version", "--check", "--readme", "--targets", "--c-coverage"}


def _commands():
    """(page, command line, whole) for every ``automdt SUBCOMMAND ...`` in a code block (whole: a
    command to run) or in inline code (a mention: only its options are checked)."""
    subs = set(_subparsers(build_parser()))
    pattern = re.compile(r"(?:^|[\s/=])automdt\s+(" + "|".join(map(re.escape, subs)) + r")\b([^#\n]*)")
    for page in PAGES:
        with open(page) as f:
            text = f.read()
        blocks = [b.replace("\\\n", " ") for b in FENCE.findall(text)]
        spans = INLINE.findall(FENCE.sub("", text))
        for chunks, whole in ((blocks, True), (spans, False)):
            for chunk in chunks:
                for m in pattern.finditer(chunk):
                    line = (m.group(1) + m.group(2)).split("&&")[0].split("|")[0].rstrip(" &;")
                    yield os.path.relpath(page, ROOT), line, whole


def test_every_command_shown_in_the_docs_parses():
    parser = build_parser()
    subs = _subparsers(parser)
    bad, seen = [], 0
    for page, line, whole in _commands():
        seen += 1
        if whole:
            try:
                parser.parse_args(shlex.split(line))
            except SystemExit:
                bad.append(f"{page}: automdt {line}")
        else:
            sub = line.split()[0]
            for opt in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", line[len(sub):]):
                if opt not in subs[sub]._option_string_actions:
                    bad.append(f"{page}: `automdt {line}`: automdt {sub} has no {opt}")
    assert seen > 20
    assert not bad, "commands in the docs that `automdt` refuses:\n" + "\n".join(bad)


def test_every_option_named_in_the_docs_exists():
    known = _options(build_parser()) | _script_options() | OTHER_TOOLS
    bad = []
    for page in PAGES:
        with open(page) as f:
            text = f.read()
        for opt in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))):
            if opt not in known:
                bad.append(f"{os.path.relpath(page, ROOT)}: {opt}")
    assert not bad, "options the docs name that no parser defines:\n" + "\n".join(bad)


def test_every_exit_code_named_in_the_docs_is_defined():
    codes = set(errors.EXIT_CODES)
    phrase = re.compile(r"\bexit(?:s|ed| code| codes| status)?\s+(\d+)(?:\s*(?:,|/|or|and)\s*(\d+))*", re.I)
    bad = []
    for page in PAGES:
        with open(page) as f:
            text = f.read()
        for m in phrase.finditer(text):
            for n in re.findall(r"\d+", m.group(0)):
                if int(n) not in codes:
                    bad.append(f"{os.path.relpath(page, ROOT)}: {m.group(0)!r}")
        for m in re.finditer(r"SuccessExitStatus=([\d ]+)", text):
            bad += [f"{page}: SuccessExitStatus {n}" for n in m.group(1).split() if int(n) not in codes]
    assert not bad, "exit codes the docs name that automdt.errors does not define:\n" + "\n".join(bad)


def test_the_reference_pages_are_generated_not_written():
    with open(os.path.join(ROOT, "docs", "cli.md")) as f:
        cli = f.read()
    assert ":module: automdt.cli" in cli and ":func: build_parser" in cli
    with open(os.path.join(ROOT, "docs", "exit-codes.md")) as f:
        assert "```{exit-codes}" in f.read()
    with open(os.path.join(ROOT, "docs", "conf.py")) as f:
        assert '("man", "automdt"' in f.read()  # the man page: the parser plus its sections


def test_exit_codes_command_prints_every_code():
    out = subprocess.run([sys.executable, "-m", "automdt", "exit-codes"], capture_output=True, text=True,
                         timeout=60).stdout
    for code in errors.EXIT_CODES:
        assert re.search(rf"^\s*{code}\b", out, re.M), f"`automdt exit-codes` does not list {code}"


def test_the_readme_speed_table_is_generated_from_the_latest_results():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "_ext", "automdt_docs.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, "README.md's generated block is stale: python docs/_ext/automdt_docs.py --readme"


@pytest.mark.parametrize("line", ["transfer a b --no-such-option", "frobnicate"])
def test_the_command_check_catches_a_wrong_command(line):
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split(line))


def test_every_environment_variable_named_in_the_docs_is_read_by_the_code():
    sources = ""
    for pattern in ("automdt/*.py", "agents/*.py", "simulator/*.py", "transfer_engine/*.py", "transfer_engine/src/*.[ch]",
                    "experiments/*.py"):
        for path in glob.glob(os.path.join(ROOT, pattern)):
            with open(path, errors="replace") as f:
                sources += f.read()
    bad = []
    for page in PAGES:
        with open(page) as f:
            for var in sorted(set(re.findall(r"\bAUTOMDT_[A-Z0-9_]+", f.read()))):
                if var not in sources:
                    bad.append(f"{os.path.relpath(page, ROOT)}: {var}")
    assert not bad, "environment variables the docs name that no code reads:\n" + "\n".join(bad)


def test_the_summary_example_is_what_a_default_transfer_writes(tmp_path):
    """docs/formats/summary.md shows the summary of a default run of two small files: the same
    fields, the same start (its source and counts) as such a run writes now."""
    import json

    with open(os.path.join(ROOT, "docs", "formats", "summary.md")) as f:
        example = json.loads(re.search(r"```json\n(.*?)```", f.read(), re.S).group(1))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(os.urandom(15_000_000))
    (src / "b").write_bytes(os.urandom(15_005_000))
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "automdt", "transfer", str(src), str(tmp_path / "dest"), "--json",
                        "--no-history"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert set(got) == set(example)
    assert set(got["start"]) == set(example["start"])
    assert got["start"]["source"] == example["start"]["source"]
    assert got["start"]["threads"] == example["start"]["threads"] == example["threads"]


def test_the_troubleshooting_page_has_a_section_for_every_failure_code():
    with open(os.path.join(ROOT, "docs", "troubleshooting.md")) as f:
        headings = " ".join(re.findall(r"^## (.*)$", f.read(), re.M))
    missing = [code for code in errors.EXIT_CODES if code != 0 and not re.search(rf"\b{code}\b", headings)]
    assert not missing, f"docs/troubleshooting.md has no section for exit codes {missing}"


def test_the_man_page_has_its_sections_and_the_html_reference_does_not():
    """Sections inside an `only` block leak into every builder; the man page is its own document."""
    with open(os.path.join(ROOT, "docs", "man.md")) as f:
        man = f.read()
    for section in ("Examples", "Exit status", "Environment", "Files", "See also"):
        assert f"\n## {section}\n" in man, section
    with open(os.path.join(ROOT, "docs", "cli.md")) as f:
        cli = f.read()
    assert "{only}" not in cli and "## Exit status" not in cli
