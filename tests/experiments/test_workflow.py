"""The simulated workflow experiment (experiments/workflow.py): a held-out path is explored with an
error, trained and scored beside the default; a kept file is scored again without training, so a
rule that acts at run time is measured on the same files."""
import os

from automdt.experiments import workflow as W
from automdt.experiments.ablation import held_out_cases


def test_a_kept_file_is_scored_again_without_training(tmp_path):
    case = held_out_cases(1, seed=W.SEED, families=("static",))[0]
    first = W.run_path(case, str(tmp_path), timesteps=512)
    assert os.path.exists(tmp_path / f"{case.name}.zip")
    mtime = os.path.getmtime(tmp_path / f"{case.name}.zip")
    again = W.run_path(case, str(tmp_path), timesteps=512)
    assert os.path.getmtime(tmp_path / f"{case.name}.zip") == mtime  # not trained again
    assert [r["whole"] for r in again] == [r["whole"] for r in first]
    assert {r["learned"] for r in again} == {r["learned"] for r in first}
    assert {r["controller"] for r in first} == {"trained", "default"}
    assert {r["run"] for r in first} == {"explored", *W.CHANGES}
    # another seed draws other paths, other fit errors and other changes
    other = held_out_cases(1, seed=W.SEED + 1, families=("static",))[0]
    assert other.profile.to_dict() != case.profile.to_dict()
