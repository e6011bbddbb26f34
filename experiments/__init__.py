"""Scripted, reproducible comparisons of policies (scenarios -> CSV, PNG, markdown).

``python -m automdt.experiments bottlenecks|convergence|completion|fairness|cost|real|changing|all
[--quick]``; see :mod:`automdt.experiments.run` for what each writes, :mod:`automdt.experiments.scenarios`
for the emulated paths and datasets, :mod:`automdt.experiments.realpaths` for the paths whose
bottleneck is a real resource and :mod:`automdt.experiments.changing` for the paths that change. The same functions are importable (the notebooks use them):
``from automdt.experiments import run, scenarios``.
"""
