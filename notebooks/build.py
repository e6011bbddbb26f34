"""Build the notebooks of this folder from source (``python notebooks/build.py``).

The ``.ipynb`` files are generated, committed without outputs, and rebuilt by this script, so
that their content is reviewable here. Each notebook starts with a cell tagged ``parameters``
(papermill convention) whose small defaults let the test suite execute it in seconds; raise them
for a real study (or run ``papermill -p duration_s 20 ...``).

* ``compare_policies.ipynb``: run policies side by side on one bottleneck scenario with the
  experiment helpers (real engine), show the plots and the tables, and the same policies in the
  simulator against the oracle.
* ``explore_train_transfer.ipynb``: explore a throttled path, fit a profile, train a PPO policy on
  it with a small budget, evaluate it in the simulator against the oracle, then transfer with it.
* ``ablation.ipynb``: the controller ablation's simulator half on held-out families (the tables
  and plots of ``python -m automdt.experiments ablation``), and the engine half's published results.
* ``changing_paths.ipynb``: the policies on a path that changes during the transfer (a moving
  bottleneck, a link that halves, a competing transfer; or your own throttle schedule): time back
  to 90% after each change, completion times; and a changing episode in the simulator.
"""
from __future__ import annotations

import os
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def _params(src: str):
    c = new_code_cell(src.strip())
    c.metadata["tags"] = ["parameters"]
    return c


def _nb(cells):
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = KERNEL
    nb.metadata["language_info"] = {"name": "python"}
    # stable cell ids: rebuilding gives byte-identical files
    for i, c in enumerate(nb.cells):
        c["id"] = f"cell-{i:02d}"
    return nb


def compare_policies():
    md, code = new_markdown_cell, new_code_cell
    return _nb([
        _params('''
# Parameters (papermill style). 15 s per transfer, as `python -m automdt.experiments bottlenecks`:
# runs under 10 s cannot converge, and their checks read n/a (the test suite injects 3 s runs to
# test the plumbing only). For a full comparison add the rest of automdt.experiments.runner.ALL_POLICIES.
scenario = "read-bound"           # read-bound | net-bound | write-bound
policies = ["ppo", "marlin", "oracle"]  # ppo: the shipped default policy (skipped, with the reason, only if its file is missing)
duration_s = 15.0                 # seconds per transfer
out = "runs"                      # run directories go here
seed = 0
sim_steps = 30                    # control intervals per simulated episode
'''),
        md('''# Comparing policies on an emulated bottleneck

AutoMDT's claim is comparative: a joint PPO agent finds the bottleneck stage, gives it just
enough threads, and stays there, where Marlin's three independent optimisers keep moving and
monolithic settings waste threads. This notebook runs the policies **side by side on the real
engine** (the local link, the engine's per-thread and total rate limits playing the disks and the
link) with the same helpers as `python -m automdt.experiments bottlenecks`, then runs the same
policies in the buffer **simulator** against the oracle.

The scenario's throttles make the optimum known in advance: see the table below.'''),
        code('''import os
from IPython.display import Image, Markdown, display

from automdt.experiments import run
from automdt.experiments.scenarios import SCENARIOS, MB

sc = SCENARIOS[scenario]
display(Markdown(
    f"**{sc.name}**: `{sc.throttle_spec()}`  \\n"
    f"achievable {sc.achievable_bps / MB:.0f} MB/s, minimal optimum (read, net, write) = {sc.optimum}, "
    f"simulator oracle = {sc.oracle_threads()}"))'''),
        md("## Run the policies on the real engine"),
        code('''st = run.Settings(out=out, seed=seed, scenarios=[scenario], policies=policies, duration_s=duration_s)
exp = run.bottlenecks(st)
print("run directory:", exp.path)
if exp.skipped:
    print("skipped:", exp.skipped)'''),
        md("Thread counts (left; dotted: the minimal optimum) and stage throughputs (right; dashed: achievable) "
           "over time, one row per policy:"),
        code('''display(Image(filename=os.path.join(exp.path, f"bottlenecks-{scenario}.png")))'''),
        md("## The tables of `results.md`"),
        code('''# results.md without its image links (the figures are shown above)
display(Markdown("\\n".join(l for l in exp.results_md().splitlines() if not l.startswith("!["))))'''),
        md("## The per-interval records with pandas\n\n`intervals.csv` holds every control interval of every "
           "transfer: what the policy saw (throughputs, buffer fills) and what it chose."),
        code('''import pandas as pd

iv = pd.read_csv(os.path.join(exp.path, "intervals.csv"))
summary = (iv.assign(delivered_MBps=iv.tput_write / MB, total_threads=iv.threads_read + iv.threads_net + iv.threads_write)
             .groupby("policy")[["delivered_MBps", "total_threads", "threads_read", "threads_net", "threads_write", "cpu"]]
             .mean().round(1))
summary'''),
        code('''import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3.5))
for pol, g in iv.groupby("policy"):
    ax.plot(g.t, g.tput_write / MB, marker="o", ms=3, label=pol)
ax.axhline(sc.achievable_bps / MB, ls="--", c="k", lw=0.8, label="achievable")
ax.axhline(0.9 * sc.achievable_bps / MB, ls=":", c="k", lw=0.8)
ax.set_xlabel("seconds"); ax.set_ylabel("delivered MB/s"); ax.set_ylim(bottom=0); ax.legend(fontsize=8)
plt.show()'''),
        *_compare_policies_in_simulator(),
    ])


def explore_train_transfer():
    md, code = new_markdown_cell, new_code_cell
    return _nb([
        _params('''
# Parameters (papermill style). Small defaults so that the test suite runs this quickly; the
# operator's real numbers are ~60 s of exploration and a training budget of minutes.
scenario = "net-bound"      # the emulated path to explore
explore_s = 15.0            # seconds of exploration on the real engine (an operator: ~60)
train_timesteps = 20_000    # PPO budget in simulator steps (a real policy: ~1-2 million, or until the target)
train_seconds = 30.0        # wall-time cap of training
transfer_s = 6.0            # seconds of the final transfer with the trained policy
out = "runs"                # where the profile, the policy and the logs go
seed = 0
'''),
        md('''# Explore → train → transfer

The AutoMDT workflow on one emulated path:

1. **explore**: a short real transfer with random thread triples; the engine's busy-time counters give
   each stage's per-thread throughput and bandwidth, fitted into a simulator **profile**;
2. **train**: PPO in the buffer simulator configured by that profile (offline, no data moves);
3. **evaluate** the policy in the simulator against the oracle (and against Marlin);
4. **transfer** with it on the real engine.

The path is one of the experiment scenarios: the engine's throttles play the disks and the link,
so the fitted profile can be checked against the truth.'''),
        code('''import atexit, datetime, os, shutil, tempfile
import pandas as pd
from IPython.display import Image, Markdown, display

from automdt.experiments.scenarios import SCENARIOS, MB, DEFAULT_MEMORY, DEFAULT_CHUNK, large_dataset, default_data_root
from automdt.sender import TransferOptions

sc = SCENARIOS[scenario]
work = os.path.join(out, "explore_train_transfer-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
os.makedirs(work, exist_ok=True)
scratch = tempfile.mkdtemp(prefix="automdt-nb-", dir=default_data_root())
atexit.register(shutil.rmtree, scratch, True)  # the generated data goes with the kernel, even after an error
# enough data for the exploration and the transfer at the achievable rate
ds = large_dataset(int(sc.achievable_bps * max(explore_s, transfer_s) * 1.2 + 2 * DEFAULT_MEMORY), 8, seed).generate(scratch)
opts = TransferOptions(memory=DEFAULT_MEMORY, chunk_size=DEFAULT_CHUNK, interval_s=1.0, max_threads=32,
                       throttle={k: tuple(v) for k, v in sc.throttle.items()})
display(Markdown(f"path **{sc.name}**: `{sc.throttle_spec()}`; dataset {ds.total_bytes / MB:.0f} MB in {len(ds.files)} files; "
                 f"working directory `{work}`"))'''),
        md("## 1. Explore\n\nIf the exploration is too short to observe every stage, the fit fails; the notebook "
           "then says so and goes on with the path's true profile (plus 5% noise), so that the rest of the "
           "walkthrough still runs. Explore longer (`explore_s`) for a fitted profile."),
        code('''from automdt.errors import AutomdtError
from automdt.explore import explore
from automdt.simulator.profile import ProfileError

truth = sc.profile()
try:
    res = explore(ds.path, os.path.join(scratch, "explore-dest"), explore_s, opts, seed=seed)
    profile, source = res["profile"], "fitted"
except (ProfileError, AutomdtError) as e:
    res, profile, source = None, truth.replace(noise=0.05, meta={"source": "scenario (exploration failed)"}), "true+noise"
    display(Markdown(f"**Exploration of {explore_s:g} s could not fit the profile**: {e}  \\n"
                     "Continuing with the scenario's true profile plus 5% noise."))
finally:
    shutil.rmtree(os.path.join(scratch, "explore-dest"), ignore_errors=True)
profile.save(os.path.join(work, "profile.yaml"))
pd.DataFrame([{"stage": s,
               f"{source} TPT MB/s": round(f.tpt / MB, 1), "true TPT MB/s": round(t.tpt / MB, 1),
               f"{source} B MB/s": round(f.bandwidth / MB, 1), "true B MB/s": round(t.bandwidth / MB, 1)}
              for s, f, t in zip(("read", "net", "write"), profile.stages, truth.stages)]).set_index("stage")'''),
        code('''if res is not None:
    samples = pd.DataFrame(res["samples"])
    print(f"{len(samples)} exploration intervals, {res['rounds']} round(s); fitted noise {profile.noise:.3f}")
    display(samples[["t", "threads", "bytes", "busy_s"]].head())'''),
        md("## 2. Train PPO in the simulator on the profile"),
        code('''from automdt.agents.training import train

rep = train(profile, os.path.join(work, "policy.zip"), timesteps=train_timesteps, seed=seed,
            target_fraction=0.95, max_seconds=train_seconds, progress=False)
print(f"{rep.timesteps} steps in {rep.wall_s:.0f} s: {rep.fraction_of_oracle:.3f} of the oracle ({rep.stop_reason})")
display(Image(filename=str(rep.curve_png)))'''),
        *_explore_train_transfer_evaluate(),
    ])


def changing_paths():
    md, code = new_markdown_cell, new_code_cell
    return _nb([
        _params('''
# Parameters (papermill style). The defaults are the short variant the test suite runs; for a real
# study use quick = False and every policy (see automdt.experiments.changing.CHANGING_POLICIES).
scenario = "moving-bottleneck"   # moving-bottleneck (loopback) | link-halves | competing-transfer (root)
policies = ["ppo", "marlin", "oracle-phases"]
quick = True                     # changes at half the times, half the data
schedule_file = None             # a throttle schedule of your own (YAML {at, throttle} list): scenario "schedule"
out = "runs"
seed = 0
'''),
        md('''# Changing paths: does the tuner follow a bottleneck that moves?

The AutoMDT slides sell the joint agent on adapting "to changing network conditions in real time".
This notebook runs the policies **on the real engine while the path changes** at fixed times, with
`python -m automdt.experiments changing`'s helpers:

* `moving-bottleneck`: a throttle schedule (`automdt transfer --throttle @FILE` takes the same file)
  makes the path read-bound, then write-bound: the optimum moves from (8, 2, 2) to (2, 2, 8);
* `link-halves` / `competing-transfer` (need root): a `tc tbf` link between two network namespaces,
  with the delay forwarder's RTT, halves and recovers, or a second transfer joins and leaves it.

For each change: seconds until the transfer is back at 90% of the new achievable rate; and the
completion time of the whole copy. `oracle-phases` switches to each phase's optimum at the change
times (it knows the future; no tuner does).'''),
        code('''import os
import pandas as pd
from IPython.display import Image, Markdown, display

from automdt.experiments import run
from automdt.experiments.changing import changing_scenarios
from automdt.experiments.scenarios import MB

st = run.Settings(out=out, seed=seed, quick=quick, policies=policies,
                  scenarios=["schedule" if schedule_file else scenario],
                  throttle=("@" + schedule_file) if schedule_file else None)
exp = run.changing(st)
print("run directory:", exp.path)
if exp.skipped:
    print("skipped:", exp.skipped)'''),
        md("Thread counts (left) and stage throughputs (right) over time, one row per policy; grey lines: "
           "the path changes; dashed: each phase's achievable rate, dotted: 90% of it."),
        code('''name = st.scenarios[0]
png = os.path.join(exp.path, f"changing-{name}.png")
if os.path.exists(png):
    display(Image(filename=png))'''),
        md("## The tables of `results.md`"),
        code('''display(Markdown("\\n".join(l for l in exp.results_md().splitlines() if not l.startswith("!["))))'''),
        md("## Per change, per policy\n\n`runs.csv` has one line per transfer; `time_to_90` lists the seconds to "
           "90% from the start and after each change (`None`: not within that phase)."),
        code('''rows = []
for r in exp.results:
    ttf = r.extra.get("time_to_90") or []
    rows.append({"policy": r.policy, "completion_s": round(r.extra.get("completion_s") or float("nan"), 2),
                 **{("from start" if i == 0 else f"after change {i}"): (None if x is None else round(x, 1))
                    for i, x in enumerate(ttf)},
                 **{f"mean {s} threads": round(r.metrics.get(f"mean_threads_{s}", float("nan")), 1)
                    for s in ("read", "net", "write")}})
pd.DataFrame(rows).set_index("policy")'''),
        code('''import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3.5))
for r in exp.results:
    t = [x["t"] for x in r.rows]
    ax.plot(t, [x["tput_write"] / MB for x in r.rows], marker="o", ms=2, label=r.policy)
for c in (exp.results[0].extra.get("change_t") or []) if exp.results else []:
    ax.axvline(c, color="gray", lw=0.8)
ax.set_xlabel("seconds"); ax.set_ylabel("delivered MB/s"); ax.set_ylim(bottom=0); ax.legend(fontsize=8)
plt.show()'''),
        *_changing_paths_in_simulator(),
    ])


def ablation():
    md, code = new_markdown_cell, new_code_cell
    return _nb([
        _params('''
# Parameters (papermill style). The published ablation uses per_family=45, reps=3 (315 cases):
# `python -m automdt.experiments ablation`. Small defaults run in seconds.
per_family = 4                     # held-out simulated cases per family
reps = 1                           # repetitions per case (other noise)
controllers = ["default", "capacity", "shield:ppo", "ppo", "model", "marlin", "topdown", "best-static"]
families = ["static", "two-stage", "contention", "noise", "moving", "link", "competing"]
out = "runs"                       # the run directory goes here
engine_results = "experiments/results/ablation-engine.json"  # shown if it exists (the engine half takes hours)
'''),
        md('''# The controller ablation

Which part of the controller earns its place? This notebook runs the simulator half of
`python -m automdt.experiments ablation`: every controller on held-out paths from a seeded
generator that no training or tuning used, in families (static paths, two stages limiting at once,
contention, heavy noise, a bottleneck that moves, a link that drops and recovers, a competing
transfer), and scores each run as the fraction of the oracle's utility it reached over intervals
20-60. The policies appear alone and under the shield, beside the best non-learned controllers.'''),
        code('''import os, time
from IPython.display import Markdown, display

from automdt.experiments import ablation as A

cases = A.held_out_cases(per_family, families=families)
t0 = time.monotonic()
rows = A.run_sim(cases, controllers, reps=reps, workers=2)
path = A.write_sim_results(os.path.join(out, "ablation-notebook"), cases, rows, reps, time.monotonic() - t0)
print(len(cases), "cases,", len(rows), "runs in", round(time.monotonic() - t0, 1), "s:", path)'''),
        md("## The tables the docs show (generated from the results file)"),
        code('''display(Markdown(A.sim_tables(path)))'''),
        md("## Mean fraction of the oracle per family, with bootstrap 95% intervals"),
        code('''import json
import matplotlib.pyplot as plt
import numpy as np

summary = json.load(open(path))["summary"]
fams = [f for f in summary if f != "all"] + ["all"]
fig, ax = plt.subplots(figsize=(9, 3.8))
width = 0.8 / len(controllers)
for j, lab in enumerate(controllers):
    m = [summary[f][lab]["mean"] for f in fams]
    lo = [summary[f][lab]["mean"] - summary[f][lab]["mean_ci"][0] for f in fams]
    hi = [summary[f][lab]["mean_ci"][1] - summary[f][lab]["mean"] for f in fams]
    ax.bar(np.arange(len(fams)) + j * width, m, width, yerr=[lo, hi], label=lab, capsize=2)
ax.set_xticks(np.arange(len(fams)) + 0.4 - width / 2, fams)
ax.set_ylim(0.4, 1.08); ax.axhline(1.0, c="k", lw=0.6); ax.set_ylabel("fraction of the oracle")
ax.legend(fontsize=7, ncol=4)
plt.show()'''),
        md("## Case by case: the default against the model-based controller\n\nEach point is one held-out case "
           "(the mean of its repetitions); above the diagonal the default did better."),
        code('''cases_by = A.per_case(rows)
fig, ax = plt.subplots(figsize=(4.5, 4.5))
for f in families:
    d, m = cases_by.get((f, "default"), {}), cases_by.get((f, "model"), {})
    common = sorted(set(d) & set(m))
    ax.scatter([m[c] for c in common], [d[c] for c in common], s=14, label=f)
ax.plot([0, 1.1], [0, 1.1], c="k", lw=0.6); ax.set_xlim(0.2, 1.1); ax.set_ylim(0.2, 1.1)
ax.set_xlabel("model"); ax.set_ylabel("default"); ax.legend(fontsize=7)
plt.show()'''),
        md("## The engine half\n\nThe engine half runs the controllers on held-out paths of the real engine "
           "(`--part engine`, about two hours, root for its namespaces, CPU quota and disk paths); its published "
           "results file is shown when it exists."),
        code('''from automdt.experiments.ablation_engine import engine_tables

if os.path.exists(engine_results):
    display(Markdown(engine_tables(engine_results)))
else:
    print("no engine results at", engine_results)'''),
    ])


NOTEBOOKS = {"compare_policies.ipynb": compare_policies, "explore_train_transfer.ipynb": explore_train_transfer,
             "changing_paths.ipynb": changing_paths, "ablation.ipynb": ablation}


def _compare_policies_in_simulator():
    """The compare-policies notebook's last section: the same policies in the simulator."""
    md, code = new_markdown_cell, new_code_cell
    return [
        md("## The same policies in the simulator\n\nThe scenario as a simulator profile (the throttles are "
           "exactly its `min(n * tpt, B)` stages), each policy for `sim_steps` intervals, scored against the "
           "oracle's utility."),
        code('''from automdt.experiments.runner import PolicyUnavailable, build_policy
from automdt.simulator.oracle import evaluate_policy_in_sim

prof = sc.profile()
rows = []
for pol_name in policies:
    try:
        pol = build_policy(pol_name, sc)
    except PolicyUnavailable as e:
        rows.append({"policy": pol_name, "note": str(e)})
        continue
    tr = evaluate_policy_in_sim(pol, prof, steps=sim_steps, seed=seed)
    rows.append({"policy": pol_name, "fraction_of_oracle": round(tr.fraction_of_oracle, 3),
                 "settled_threads": tr.settled_threads, "oracle_threads": tr.oracle.threads,
                 "mean_MBps": round(tr.mean_throughput_bps / MB, 1)})
pd.DataFrame(rows)'''),
        md("Re-run exactly: `config.json` in the run directory records the seed, the scenario, its profile, "
           "the engine options, the policy specs (and the PPO file's hash) and the git commit, and its "
           "`rerun` field is the equivalent command line."),
    ]


def _explore_train_transfer_evaluate():
    """Sections 3 and 4 of the explore-train-transfer notebook: evaluate in the simulator, then transfer."""
    md, code = new_markdown_cell, new_code_cell
    return [
        md("## 3. Evaluate in the simulator\n\nOn the profile it was trained on and on the true one (what the "
           "throttles really are), against the oracle and Marlin."),
        code('''from automdt.agents.registry import make_policy
from automdt.simulator.oracle import evaluate_policy_in_sim, oracle

rows = []
for prof_name, prof in ((source, profile), ("true", truth)):
    orc = oracle(prof)
    for name, spec in (("trained PPO", f"ppo:{rep.model_path}"), ("marlin", "marlin")):
        tr = evaluate_policy_in_sim(make_policy(spec, 32), prof, steps=30, seed=seed)
        rows.append({"profile": prof_name, "policy": name, "fraction_of_oracle": round(tr.fraction_of_oracle, 3),
                     "settled": tr.settled_threads, "oracle": orc.threads,
                     "oracle MB/s": round(orc.throughput_bps / MB, 1)})
pd.DataFrame(rows)'''),
        md("## 4. Transfer with the trained policy"),
        code('''from automdt.experiments.runner import run_one

pol = make_policy(f"ppo:{rep.model_path}", 32)
r = run_one("trained-ppo", sc, ds, scratch, duration_s=transfer_s, policy=pol,
            log_path=os.path.join(work, "transfer.jsonl"))
m = r.metrics
reached = f"90% reached at {m['conv_s']:.0f} s" if m["converged"] else "90% never reached and held"
display(Markdown(f"delivered {m['mean_delivered_bps'] / MB:.1f} MB/s on average "
                 f"({100 * m['mean_delivered_frac']:.0f}% of {sc.achievable_bps / MB:.0f}); {reached}; threads "
                 f"{'after it' if m['converged'] else 'in the second half'} (median) "
                 f"{m['after_median_read']:.0f},{m['after_median_net']:.0f},{m['after_median_write']:.0f} "
                 f"vs the optimum {sc.optimum}"))
pd.DataFrame(r.rows)[["t", "threads_read", "threads_net", "threads_write", "tput_read", "tput_net", "tput_write",
                      "buf_sender", "buf_receiver"]]'''),
        code('''from automdt.experiments import plots

png = plots.timeseries_grid(os.path.join(work, "transfer.png"), f"trained PPO on {sc.name}", [r],
                            sc.achievable_bps, sc.optimum)
display(Image(filename=png))'''),
        code('''shutil.rmtree(scratch, ignore_errors=True)  # the generated dataset
print("kept:", sorted(os.listdir(work)))'''),
    ]


def _changing_paths_in_simulator():
    """The changing-paths notebook's last section: the same kind of change in the simulator."""
    md, code = new_markdown_cell, new_code_cell
    return [
        md('''## The same kind of change in the simulator

`ProfileChanges` gives training episodes a profile that changes mid-episode (here: the read-bound
path's stages rescaled at a random step), so that a policy trained with it has seen a moving
bottleneck. One such episode, the thread counts and the delivered rate of Marlin, and the oracle
before and after the change:'''),
        code('''from automdt.agents.registry import make_policy
from automdt.simulator import BufferSimEnv, ProfileChanges
from automdt.experiments.scenarios import SCENARIOS

prof = SCENARIOS["read-bound"].profile()
env = BufferSimEnv(prof, episode_steps=30, random_start=False,
                   changes=ProfileChanges(probability=1.0, max_changes=1, factor_range=(0.25, 4.0)))
_, info = env.reset(seed=seed + 3, options={"threads": (1, 1, 1)})
before = env.episode_oracle().threads
pol = make_policy("marlin", 32)
pol.reset(32, seed)
trace = []
for step in range(30):
    _, _, _, _, info = env.step_threads(pol.act(info["observation"]))
    o = info["observation"]
    trace.append({"step": step + 1, "changes": info["sim/profile_changes"], "threads": o.threads,
                  "delivered MB/s": round(o.throughput_bps[2] / MB, 1)})
print("oracle before the change:", before, " after:", env.episode_oracle().threads)
pd.DataFrame(trace).set_index("step").T'''),
        md("Re-run exactly: the run directory's `config.json` has the seed, the scenario with its changes, the "
           "policy specs and the git commit, and `rerun` is the equivalent command line."),
    ]


def build(dest: str = HERE) -> list:
    paths = []
    for name, fn in NOTEBOOKS.items():
        nb = fn()
        nbformat.validate(nb)
        path = os.path.join(dest, name)
        with open(path, "w") as f:
            nbformat.write(nb, f)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build(sys.argv[1] if len(sys.argv) > 1 else HERE):
        print(p)
