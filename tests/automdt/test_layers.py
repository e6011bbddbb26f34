"""The floors of the package (pyproject.toml's layers contract, checked by ``make lint``) cover
every module: a module on no floor would be free of the contract."""
import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _floors():
    (layers,) = [c for c in _config()["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [[m.strip() for m in floor.split(":")] for floor in layers["layers"]]


def _package_modules():
    """Every module and subpackage directly under ``automdt`` in the installed layout."""
    dirs = _config()["tool"]["setuptools"]["package-dir"]
    names = {p for p in dirs if p.count(".") == 1}
    for entry in os.listdir(os.path.join(ROOT, dirs["automdt"])):
        if entry.endswith(".py") and entry != "__init__.py":
            names.add("automdt." + entry[:-3])
    return names


def test_every_module_is_on_exactly_one_floor():
    floors = _floors()
    placed = [m for floor in floors for m in floor]
    assert len(placed) == len(set(placed)), "a module is on two floors"
    missing = _package_modules() - set(placed)
    assert not missing, f"not on any floor of the layers contract in pyproject.toml: {sorted(missing)}"
    assert not set(placed) - _package_modules(), "a floor names a module that does not exist"


def test_the_floors_run_from_experiments_down_to_the_bottom_floor():
    floors = _floors()
    assert floors[0] == ["automdt.experiments"]
    assert ["automdt.agents"] in floors and ["automdt.simulator"] in floors
    assert floors.index(["automdt.agents"]) < floors.index(["automdt.simulator"])
    assert "automdt.policy_contract" in floors[-1] and "automdt.cli" in floors[1]
