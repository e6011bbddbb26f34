"""No Python function of the project is over :data:`LIMIT` lines (its docstring not counted)
unless its docstring says why it stays whole: a reader wants the pieces of a long function named.
The engine's C functions have their own limit (``tests/engine/test_c_style.py``)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIRS = ("automdt", "agents", "simulator", "experiments", "benchmarks", "scripts", "transfer_engine")
LIMIT = 80
REASON = "stays whole"


def _functions():
    for d in DIRS:
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(base, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield os.path.relpath(path, ROOT), node


def _length(node) -> int:
    lines = node.end_lineno - node.lineno + 1
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        lines -= body[0].end_lineno - body[0].lineno + 1
    return lines


def test_no_function_is_over_the_limit_without_a_reason():
    long = [f"{path}:{node.lineno} {node.name} ({_length(node)} lines)" for path, node in _functions()
            if _length(node) > LIMIT and REASON not in (ast.get_docstring(node) or "")]
    assert not long, f"over {LIMIT} lines, docstring not counted, with no reason it {REASON}: {long}"


def test_the_check_sees_a_long_function():
    src = "def f():\n    '''doc'''\n" + "    x = 1\n" * (LIMIT + 1)
    (node,) = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)]
    assert _length(node) == LIMIT + 2
