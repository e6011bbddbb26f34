"""What ``results.md`` and the time-series plots say about short runs (``--quick``): the thread
triple after convergence is one that ran (not per-stage medians, whose midpoint of two counts never
ran), a run that reached 90% only at its end reads "too short" (not "never"), the plots reach the
end of every run, and a training curve of one evaluation is readable."""
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from automdt.experiments import metrics as M
from automdt.experiments import plots, run
from automdt.experiments.runner import RunDir, RunResult
from automdt.experiments.scenarios import MB, SCENARIOS

SC = SCENARIOS["read-bound"]  # 80 MB/s achievable; minimal optimum (8, 2, 2)


def _rows(triples, tputs_mb, dt=1.0):
    return [{"t": round(dt * (i + 1), 3), "interval_s": dt,
             **{f"threads_{s}": n for s, n in zip(("read", "net", "write"), tr)},
             **{f"tput_{s}": x * MB for s in ("read", "net", "write")}, "cpu": 5.0}
            for i, (tr, x) in enumerate(zip(triples, tputs_mb))]


def _result(policy, rows, seconds):
    return RunResult(scenario=SC.name, policy=policy, dataset="large", rows=rows,
                     summary={"seconds": seconds, "bytes": 0, "exit_code": 10},
                     metrics=M.run_metrics(rows, SC.achievable_bps, SC.bottleneck, SC.min_threads),
                     wall_s=seconds, cpu_s=0.1, completed=False)


def _results():
    return [
        # two intervals after its (unconverged) first half: 32,8,2 then 11,3,3 (medians: 21.5,5.5,2.5)
        _result("ppo", _rows([(4, 2, 8), (32, 8, 2), (11, 3, 3)], [33, 65, 75]), 3.1),
        _result("marlin", _rows([(1, 1, 1), (2, 2, 2)], [9, 19]), 3.1),
        # the oracle: 86% in its first interval, then 99.9% in the last: the run ended there
        _result("oracle", _rows([(8, 2, 2), (8, 2, 2)], [68.7, 79.9]), 3.0),
    ]


def test_results_md_names_triples_that_ran_and_too_short_runs(tmp_path):
    st = run.Settings(out=str(tmp_path), quick=True, log=lambda s: None)
    rd = RunDir(str(tmp_path), "bottlenecks")
    results = _results()
    exp = run._write_timeseries_experiment("bottlenecks", st, rd, [SC], ["ppo", "marlin", "oracle"], {}, results, 3.0)
    md = exp.results_md()
    table = md.split("## read-bound", 1)[1].split("\n\n")[2]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in table.splitlines()[2:]}
    head = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    conv, triple = head.index("conv s (90%)"), head.index("threads after conv (most run r,n,w)")
    assert rows["ppo"][triple] == "11,3,3"  # ran; the medians' "22,6,2" never did
    ran = {f"{r['threads_read']},{r['threads_net']},{r['threads_write']}" for r in results[0].rows}
    assert rows["ppo"][triple] in ran
    assert rows["oracle"][triple] == "8,2,2" and rows["marlin"][triple] == "2,2,2"
    assert rows["oracle"][conv] == "too short"  # 99.9% in its last interval: too few left to tell
    assert rows["marlin"][conv] == "never"  # never above 90%
    assert "*too short*" in md and "*most run*" in md
    pv = md.split("## PPO vs Marlin", 1)[1]
    assert "| read-bound | ppo | too short | never |" in pv


def test_plots_reach_the_end_of_every_run():
    results = _results()
    assert plots.run_end(results[0]) == pytest.approx(3.1)
    # never before the last record, whatever the summary says
    assert plots.run_end(_result("x", _rows([(1, 1, 1)] * 4, [10] * 4), 2.0)) == pytest.approx(4.0)
    fig = Figure()
    axes = fig.subplots(len(results), 2, squeeze=False)
    plots._mark_ends(axes, results)
    for row, r in zip(axes, results):
        for ax in row:
            assert ax.get_xlim()[1] >= 3.1  # the longest run's end, not the last record's 3.0 or 2.0
            assert any(abs(line.get_xdata()[0] - plots.run_end(r)) < 1e-9 for line in ax.get_lines())


def test_a_training_curve_of_one_evaluation_is_readable(tmp_path):
    from automdt.agents.training import EvalPoint, _write_curve

    png = tmp_path / "curve.png"
    fig = _write_curve([EvalPoint(2048, 3.0, 0.5, 0.97, 0.95)], tmp_path / "curve.csv", png, 0.95, "one profile")
    assert png.exists() and (tmp_path / "curve.csv").read_text().count("\n") == 2
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert lo == 0 and hi > 2048  # from 0 steps, the point inside the axis (not centred alone on it)
    notes = " ".join(t.get_text() for t in ax.texts)
    assert "first evaluation (2048 steps)" in notes and "0.970 of the oracle" in notes, notes
    fig = _write_curve([], tmp_path / "none.csv", Path(tmp_path / "none.png"), 0.95, "nothing")
    assert "no evaluation" in " ".join(t.get_text() for t in fig.axes[0].texts)
