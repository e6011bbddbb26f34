"""Execute the notebooks once into docs/notebooks/ with their outputs (``make notebooks-render``).

The site shows these committed outputs and never runs a kernel (``nb_execution_mode = "off"``).
Each notebook runs from a clean kernel in a temporary working directory with the small
parameters the test suite uses (``tests/notebooks``), injected papermill-style in a cell after the
one tagged ``parameters`` and kept, so a reader sees which values made the outputs shown.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import nbclient
import nbformat

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DOCS)
SOURCE = os.path.join(ROOT, "notebooks")
TARGET = os.path.join(DOCS, "notebooks")

# the parameters tests/notebooks/test_notebooks.py runs them with: seconds, not minutes
SMALL = {
    "compare_policies.ipynb": {"duration_s": 3.0, "policies": ["ppo", "marlin", "oracle"]},
    "explore_train_transfer.ipynb": {"explore_s": 12.0, "train_timesteps": 8192, "train_seconds": 20.0,
                                     "transfer_s": 4.0},
    "changing_paths.ipynb": {"policies": ["marlin", "oracle-phases"]},
    "ablation.ipynb": {"per_family": 2, "controllers": ["default", "marlin", "model", "best-static"]},
}


def _kernel() -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix"], check=True,
                       capture_output=True, timeout=60)
    return "python3"


def render(name: str, overrides: dict, workdir: str) -> None:
    nb = nbformat.read(os.path.join(SOURCE, name), as_version=4)
    idx = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    src = "# the values this rendering ran with (small, as the test suite's): raise them for a real study\n"
    cell = nbformat.v4.new_code_cell(src + "\n".join(f"{k} = {v!r}" for k, v in overrides.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(idx + 1, cell)
    nbclient.NotebookClient(nb, timeout=600, kernel_name=_kernel(),
                            resources={"metadata": {"path": workdir}}).execute()
    for c in nb.cells:
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                raise RuntimeError(f"{name}: {o.get('ename')}: {o.get('evalue')}")
    os.makedirs(TARGET, exist_ok=True)
    nbformat.write(nb, os.path.join(TARGET, name))


def main() -> int:
    names = sys.argv[1:] or list(SMALL)
    for name in names:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="amdt-nb-") as work:
            render(name, SMALL[name], work)
        print(f"{name}: {time.monotonic() - t0:.0f} s -> {os.path.relpath(os.path.join(TARGET, name), ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
