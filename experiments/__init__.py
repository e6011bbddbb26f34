"""Scripted, reproducible comparisons of policies (scenarios -> CSV, PNG, markdown)."""
