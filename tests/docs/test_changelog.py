"""CHANGELOG.md keeps the Keep a Changelog form, and its latest release is the package's version."""
import os
import re
import subprocess
import tomllib

from automdt import __version__

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _changelog() -> str:
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        return f.read()


def test_changelog_has_unreleased_then_dated_releases_each_with_a_link():
    text = _changelog()
    headings = re.findall(r"^## \[([^\]]+)\](.*)$", text, re.M)
    assert headings[0][0] == "Unreleased"
    releases = headings[1:]
    assert releases, "no released version"
    for version, rest in releases:
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
        assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", rest), f"[{version}] needs ' - YYYY-MM-DD'"
    for name, _ in headings:
        assert re.search(rf"^\[{re.escape(name)}\]: \S+", text, re.M), f"no link for [{name}]"
    kinds = set(re.findall(r"^### (\w+)$", text, re.M))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds


def test_the_version_comes_from_the_latest_release_tag():
    """At the release's tag the version is the release; after it, a development version of the
    next one (setuptools-scm: 0.1.1.devN+g<hash>), never a number the changelog does not know."""
    from packaging.version import Version

    latest = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", _changelog(), re.M)[0]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert "version" not in project and "version" in project["dynamic"]
    git = os.path.isdir(os.path.join(ROOT, ".git"))
    shallow = git and subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip() == "true"
    tagged = git and subprocess.run(["git", "tag", "--list", "v*"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.split()
    v = Version(__version__)
    if not git or shallow or not tagged:
        # an export, a shallow clone or a checkout fetched without tags has no release to name:
        # its version must not claim one (setuptools-scm: a dev version, or the fallback 0+unknown)
        assert v.is_devrelease or __version__ == "0+unknown", __version__
        return
    if v.is_devrelease:
        assert Version(v.base_version) > Version(latest), __version__
    else:
        assert v.base_version == latest, __version__
    if git:
        tags = subprocess.run(["git", "tag", "--list", f"v{latest}"], cwd=ROOT, capture_output=True, text=True).stdout
        assert tags.split() == [f"v{latest}"], f"no tag v{latest} for the latest release"
