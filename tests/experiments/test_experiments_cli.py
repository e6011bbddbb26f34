"""``python -m automdt.experiments``: one way in, and its help lists every experiment."""
import pytest

from automdt.experiments import run


def test_the_overview_lists_every_experiment_and_exits_2_without_one(capsys):
    assert run.main([]) == 2
    assert run.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in [*run.RUNNERS, "all", *run.MODULE_EXPERIMENTS]:
        assert f"\n  {name} " in out, f"--help does not list {name}"


@pytest.mark.parametrize("name", [*run.RUNNERS, *run.MODULE_EXPERIMENTS])
def test_every_experiment_answers_help(name, capsys):
    try:
        code = run.main([name, "--help"])
    except SystemExit as e:  # argparse's help exits 0
        code = e.code
    assert code == 0
    assert "usage:" in capsys.readouterr().out
