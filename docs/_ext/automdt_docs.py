"""Generated parts of the AutoMDT documentation.

Every table of figures, every exit code and every file format's field list in the site is
generated here from its source, so nothing is written twice:

* ``{exit-codes}``: the table of :data:`automdt.errors.EXIT_CODES` and the order in which the
  most serious code wins (:data:`automdt.errors._SEVERITY`);
* ``{results-table} FILE``: a table from a results file (``automdt-results/1``, schema in
  ``docs/schemas/results.schema.json``) with the date, machine, commit and command it was taken
  with, or with ``:renderer: MODULE:FUNCTION`` the Markdown that function makes of a file of its
  own format; a file that does not exist yet renders the directive's body instead;
* ``{schema-fields} FILE``: the fields of a JSON Schema in ``docs/schemas/`` as a table (``:def: NAME``:
  those of one of its ``$defs``).

The same functions render Markdown for the README's generated block:
``python docs/_ext/automdt_docs.py --readme`` rewrites it, ``--check`` exits 1 if it is stale
(``tests/docs/test_generated.py`` runs the check).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DOCS)

RESULTS_FORMAT = "automdt-results/1"
README_BEGIN = "<!-- BEGIN generated: speed (python docs/_ext/automdt_docs.py --readme) -->"
README_END = "<!-- END generated: speed -->"
README_RESULTS = "benchmarks/results/datapath.json"
README_TABLE = "summary"


# ------------------------------------------------------------------------------ Markdown
def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "met" if value else "**not met**"
    if isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    """A pipe table, one list entry per line."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def exit_codes_markdown(as_list: bool = False) -> list[str]:
    """The exit codes of :mod:`automdt.errors`, as ``automdt exit-codes`` prints them (``as_list``:
    a definition list, which suits a man page better than a table)."""
    from automdt import errors

    names = {v: k for k, v in vars(errors).items() if k.isupper() and isinstance(v, int) and not k.startswith("_")}
    names.setdefault(143, "INTERRUPTED (SIGTERM)")
    rows = [[f"`{code}`", f"`{names.get(code, '')}`", text] for code, text in sorted(errors.EXIT_CODES.items())]
    order = ", ".join(str(c) for c in errors._SEVERITY)
    if as_list:
        lines = []
        for code, text in sorted(errors.EXIT_CODES.items()):
            lines += [f"{code}", f": {text}", ""]
        return lines + [f"The most serious code wins: {order}."]
    return markdown_table(["code", "name in `automdt.errors`", "meaning"], rows) + [
        "",
        f"When several problems happen in one run, the most serious code wins, in this order: {order}; "
        "an interrupt is reported as 130 (SIGINT) or 143 (SIGTERM) whatever else happened.",
    ]


def load_results(path: str) -> dict[str, Any]:
    """Read a results file and check the fields every table needs."""
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{path}: format must be {RESULTS_FORMAT!r}")
    return data


def _tables(data: dict[str, Any]) -> list[dict[str, Any]]:
    return data["tables"]


def results_markdown(path: str, table: str | None = None, provenance: bool = True) -> list[str]:
    """One table of a results file (``table``: its ``id``; default: every table), with the run's
    date, machine, commit and command above it."""
    data = load_results(path)
    tables = [t for t in _tables(data) if table is None or t["id"] == table]
    if not tables:
        raise ValueError(f"{path}: no table {table!r}")
    lines: list[str] = []
    if provenance:
        rel = os.path.relpath(path, ROOT)
        lines += [f"Measured {data['date']} on {data['machine']}, automdt at commit `{data['commit']}`"
                  f" ({data['conditions']}). Command: `{data['command']}`. Data: `{rel}`.", ""]
    for t in tables:
        if len(tables) > 1 or (table is None and t.get("title")):
            lines += [f"**{t['title']}**", ""]
        cols = t["columns"]
        lines += markdown_table([c["label"] for c in cols], [[r.get(c["key"]) for c in cols] for r in t["rows"]])
        for note in t.get("notes", []):
            lines += ["", note]
        lines.append("")
    return lines


def _type_text(node: dict[str, Any]) -> str:
    t = node.get("type")
    if isinstance(t, list):
        return " or ".join(t)
    if t:
        return t
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " / ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    for key in ("oneOf", "anyOf"):
        if key in node:
            return " or ".join(_type_text(n) for n in node[key])
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[-1]
    return "any"


def _walk(node: dict[str, Any], prefix: str, defs: dict[str, Any], rows: list[list[Any]], depth: int) -> None:
    required = set(node.get("required", []))
    for name, sub in node.get("properties", {}).items():
        ref = sub.get("$ref", "")
        target = defs.get(ref.rsplit("/", 1)[-1], {}) if ref.startswith("#/$defs/") else {}
        desc = sub.get("description") or target.get("description", "")
        path = f"{prefix}{name}"
        rows.append([f"`{path}`", _type_text(sub), "yes" if name in required else "", desc])
        inner = target or sub
        props = inner.get("properties", {})
        self_evident = all(not v.get("description") for v in props.values())  # read/net/write, sender/receiver
        if depth < 3 and inner.get("type") == "object" and props and not inner.get("x-collapse") and not self_evident:
            _walk(inner, path + ".", defs, rows, depth + 1)


def schema_fields_markdown(path: str, definition: str | None = None) -> list[str]:
    """The fields of a JSON Schema (nested objects as ``a.b``) with type, required, meaning;
    with ``definition``, those of one entry of its ``$defs``."""
    with open(path) as f:
        schema = json.load(f)
    defs = schema.get("$defs", {})
    rows: list[list[Any]] = []
    _walk(defs[definition] if definition else schema, "", defs, rows, 0)
    return markdown_table(["field", "type", "required", "meaning"], rows)


# ------------------------------------------------------------------------------ README
def readme_block() -> list[str]:
    """The README's "How fast" block: the summary table of the latest data-path results."""
    path = os.path.join(ROOT, README_RESULTS)
    data = load_results(path)
    t = next(t for t in _tables(data) if t["id"] == README_TABLE)
    cols = t["columns"]
    table = markdown_table([c["label"] for c in cols], [[r.get(c["key"]) for c in cols] for r in t["rows"]])
    return [README_BEGIN, *table, "",
            f"Measured {data['date']} on {data['machine']} (commit `{data['commit']}`, {data['conditions']}); "
            f"data: [`{README_RESULTS}`]({README_RESULTS}).",
            README_END]


def update_readme(check: bool = False) -> bool:
    """Rewrite the README's generated block; with ``check``, only say whether it is current."""
    path = os.path.join(ROOT, "README.md")
    with open(path) as f:
        text = f.read()
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    new = text[:start] + "\n".join(readme_block()) + text[end:]
    if check:
        return new == text
    if new != text:
        with open(path, "w") as f:
            f.write(new)
    return True


# ------------------------------------------------------------------------------ Sphinx
def setup(app):  # pragma: no cover - exercised by `make docs`
    from docutils import nodes
    from docutils.parsers.rst import directives
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    class _MarkdownDirective(SphinxDirective):
        def _render(self, lines: list[str]) -> list[nodes.Node]:
            box = nodes.container()
            self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), self.content_offset, box)
            return box.children

        def _path(self, arg: str) -> str:
            path = os.path.join(ROOT, arg)
            self.env.note_dependency(path)
            return path

    class ExitCodes(_MarkdownDirective):
        option_spec = {"list": directives.flag}

        def run(self):
            return self._render(exit_codes_markdown("list" in self.options))

    class ResultsTable(_MarkdownDirective):
        required_arguments = 1
        has_content = True
        option_spec = {"table": directives.unchanged, "no-provenance": directives.flag,
                       "renderer": directives.unchanged}

        def run(self):
            path = self._path(self.arguments[0])
            if not os.path.exists(path):
                if not self.content:
                    raise self.error(f"{self.arguments[0]} does not exist and the directive has no text for that case")
                return self._render(list(self.content))
            try:
                if "renderer" in self.options:  # MODULE:FUNCTION(path) -> Markdown, for a file of its own format
                    import importlib

                    module, func = self.options["renderer"].split(":")
                    lines = getattr(importlib.import_module(module), func)(path).splitlines()
                else:
                    lines = results_markdown(path, self.options.get("table"), "no-provenance" not in self.options)
            except (ValueError, KeyError, ImportError, AttributeError) as e:
                raise self.error(f"{self.arguments[0]}: {e}") from None
            return self._render(lines)

    class SchemaFields(_MarkdownDirective):
        required_arguments = 1
        option_spec = {"def": directives.unchanged}

        def run(self):
            try:
                return self._render(schema_fields_markdown(self._path(self.arguments[0]), self.options.get("def")))
            except (OSError, KeyError, ValueError) as e:
                raise self.error(f"{self.arguments[0]}: {e}") from None

    def optional_pages(app, docname, source):
        """The table of environment variables (``docs/environment.md``) comes with the packaging
        work; the "Use" toctree lists it after the exit codes once the page exists."""
        if docname == "index" and os.path.exists(os.path.join(DOCS, "environment.md")):
            source[0] = source[0].replace("\nexit-codes\n", "\nexit-codes\nenvironment\n", 1)

    app.connect("source-read", optional_pages)
    app.add_directive("exit-codes", ExitCodes)
    app.add_directive("results-table", ResultsTable)
    app.add_directive("schema-fields", SchemaFields)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if sys.argv[1:] == ["--readme"]:
        update_readme()
    elif sys.argv[1:] == ["--check"]:
        sys.exit(0 if update_readme(check=True) else 1)
    else:
        sys.exit("usage: automdt_docs.py --readme | --check")
