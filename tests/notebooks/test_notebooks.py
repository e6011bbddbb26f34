"""The notebooks run top to bottom (nbclient) on a short scenario, from a clean kernel.

Parameters are injected papermill-style: a cell right after the one tagged ``parameters``
overrides the defaults (shorter runs, output into the test's temporary directory).
The committed notebooks must be exactly what ``notebooks/build.py`` generates, without outputs.
"""
import json
import os
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NB_DIR = os.path.join(ROOT, "notebooks")


def _kernel() -> str:
    """The ``python3`` kernelspec; installed into this interpreter's prefix if missing."""
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix"], check=True,
                       capture_output=True, timeout=60)
    return "python3"


def _execute(name, overrides, cwd, timeout=240):
    nb = nbformat.read(os.path.join(NB_DIR, name), as_version=4)
    idx = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    src = "# injected by the test\n" + "\n".join(f"{k} = {v!r}" for k, v in overrides.items())
    cell = nbformat.v4.new_code_cell(src)
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(idx + 1, cell)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=_kernel(),
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def _outputs(nb):
    texts, images = [], 0
    for c in nb.cells:
        for o in c.get("outputs", []):
            assert o.output_type != "error", f"{o.get('ename')}: {o.get('evalue')}"
            if o.output_type == "stream":
                texts.append(o.text)
            data = o.get("data", {})
            images += "image/png" in data
            for key in ("text/plain", "text/markdown", "text/html"):
                if key in data:
                    texts.append(data[key])
    return "\n".join(texts), images


def test_notebooks_are_built_by_build_py_without_outputs(tmp_path):
    subprocess.run([sys.executable, os.path.join(NB_DIR, "build.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=60)
    for name in ("compare_policies.ipynb", "explore_train_transfer.ipynb", "changing_paths.ipynb", "ablation.ipynb"):
        with open(os.path.join(NB_DIR, name)) as f:
            committed = f.read()
        with open(tmp_path / name) as f:
            assert f.read() == committed, f"{name} differs from notebooks/build.py output: rebuild it"
        nb = json.loads(committed)
        assert "parameters" in nb["cells"][0]["metadata"]["tags"]
        assert all(not c.get("outputs") and c.get("execution_count") is None
                   for c in nb["cells"] if c["cell_type"] == "code")


def test_compare_policies_notebook_runs(tmp_path):
    nb = _execute("compare_policies.ipynb", {"duration_s": 3.0, "policies": ["ppo", "marlin", "oracle"]}, tmp_path)
    text, images = _outputs(nb)
    assert images >= 2  # the experiment's grid and the notebook's own plot
    assert "(8, 2, 2)" in text and "fraction_of_oracle" in text
    runs = [d for d in os.listdir(tmp_path / "runs") if d.startswith("bottlenecks-")]
    assert len(runs) == 1
    d = tmp_path / "runs" / runs[0]
    assert (d / "results.md").exists() and (d / "intervals.csv").exists()


def test_explore_train_transfer_notebook_runs(tmp_path):
    nb = _execute("explore_train_transfer.ipynb",
                  {"explore_s": 12.0, "train_timesteps": 8192, "train_seconds": 20.0, "transfer_s": 4.0}, tmp_path)
    text, images = _outputs(nb)
    assert images >= 2  # learning curve and the transfer's plot
    assert "of the oracle" in text and "delivered" in text
    work = [d for d in os.listdir(tmp_path / "runs") if d.startswith("explore_train_transfer-")]
    assert len(work) == 1
    kept = set(os.listdir(tmp_path / "runs" / work[0]))
    assert {"profile.yaml", "policy.zip", "policy.zip.json", "transfer.jsonl", "transfer.png"} <= kept


def test_changing_paths_notebook_runs(tmp_path):
    """The short variant: the moving bottleneck (loopback, a throttle schedule) with two policies."""
    nb = _execute("changing_paths.ipynb", {"policies": ["marlin", "oracle-phases"]}, tmp_path)
    text, images = _outputs(nb)
    assert images >= 2  # the experiment's time series and the notebook's own plot
    assert "moving-bottleneck" in text and "after change 1" in text and "oracle before the change" in text
    runs = [d for d in os.listdir(tmp_path / "runs") if d.startswith("changing-")]
    assert len(runs) == 1
    d = tmp_path / "runs" / runs[0]
    assert (d / "results.md").exists() and (d / "schedule-moving-bottleneck.yaml").exists()


def test_ablation_notebook_runs(tmp_path):
    """Two cases per family, three controllers: the tables, the per-family bars and the scatter."""
    nb = _execute("ablation.ipynb", {"per_family": 2, "controllers": ["default", "model", "best-static"],
                                     "engine_results": str(tmp_path / "none.json")}, tmp_path)
    text, images = _outputs(nb)
    assert images >= 2
    assert "**moving**" in text and "| default |" in text and "no engine results" in text
    assert (tmp_path / "runs" / "ablation-notebook" / "ablation-sim.json").exists()
