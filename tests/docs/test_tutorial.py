"""The "Write your own policy" tutorial runs as written: its Python blocks in order in an empty
directory (the first is ``mypolicy.py``), then its ablation step on two cases."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_policy_tutorial_runs_from_the_file_to_the_ablation(tmp_path):
    with open(os.path.join(ROOT, "docs", "tutorial-policy.md")) as f:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)
    assert blocks[0].startswith("# mypolicy.py") and len(blocks) >= 4
    (tmp_path / "mypolicy.py").write_text(blocks[0])
    (tmp_path / "steps.py").write_text("\n".join(blocks[1:]))
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XDG_STATE_HOME=str(tmp_path / "state"), XDG_RUNTIME_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "steps.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "of the oracle" in p.stdout and "exit 0" in p.stdout and "policy: buffer-watcher" in p.stdout
    assert "notes: ['" in p.stdout  # the annotation reached the interval log
    p = subprocess.run([sys.executable, "-m", "automdt.experiments", "ablation", "--quick", "--families", "static",
                        "--controllers", "default,mypolicy:make", "--workers", "1", "--out", str(tmp_path / "runs")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "mypolicy:make" in p.stdout and "default" in p.stdout
