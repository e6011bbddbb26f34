"""The simulated task (automdt.simulator.task.SimTask): one definition of the settings and their defaults."""
import pytest

from automdt.simulator import BatchedBufferSim, BufferSimEnv, SimTask
from automdt.simulator.oracle import evaluate_policy_in_sim
from automdt.simulator.profile import Profile


def test_both_environments_take_the_task_or_its_fields_with_the_same_defaults():
    assert BufferSimEnv().task == SimTask() == BatchedBufferSim(2).task
    task = SimTask(episode_steps=7, random_start=False, chunk_bytes=4 << 20)
    by_fields = BufferSimEnv(Profile.default(), episode_steps=7, random_start=False, chunk_bytes=4 << 20)
    assert by_fields.task == task == BufferSimEnv(Profile.default(), task).task
    assert BufferSimEnv(Profile.default(), task, episode_steps=9).task == task.replace(episode_steps=9)


def test_the_same_task_gives_the_same_episode_in_either_form():
    prof = Profile.default()
    runs = []
    for env in (BufferSimEnv(prof, SimTask(episode_steps=12, random_start=False, noise=0.1)),
                BufferSimEnv(prof, episode_steps=12, random_start=False, noise=0.1)):
        _, info = env.reset(seed=5, options={"threads": (2, 2, 2)})
        out = [env.step_threads((4, 4, 4))[4]["sim/utility"] for _ in range(12)]
        runs.append(out)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("field, value", [("k", 0.0), ("episode_steps", 0), ("randomize", 1.0), ("noise", 0.9),
                                          ("substeps", 0), ("bound_penalty", -1.0), ("chunk_bytes", -1.0),
                                          ("chunk_range", (2.0, 1.0)), ("start_mix", (0.0, 0.0, 0.0))])
def test_a_bad_setting_fails_where_it_is_written_naming_it(field, value):
    with pytest.raises(ValueError, match=field):
        SimTask(**{field: value})
    with pytest.raises(ValueError, match=field):
        BufferSimEnv(**{field: value})


def test_an_unknown_setting_is_refused():
    with pytest.raises(TypeError):
        BufferSimEnv(episode_length=5)


def test_the_oracle_helper_runs_the_task_a_transfer_starts_with():
    traj = evaluate_policy_in_sim(lambda obs: (4, 4, 4), Profile.default(), steps=10, seed=0)
    assert traj.threads.shape == (10, 3) and 0.0 < traj.fraction_of_oracle <= 1.2
