"""Scripted, reproducible comparisons of policies (scenarios -> CSV, PNG, markdown).

``python -m automdt.experiments bottlenecks|convergence|completion|fairness|cost|all [--quick]``;
see :mod:`automdt.experiments.run` for what each writes and :mod:`automdt.experiments.scenarios`
for the emulated paths and datasets. The same functions are importable (the notebooks use them):
``from automdt.experiments import run, scenarios``.
"""
