"""Installing labkit (and its test extra) on Colab's stack must not change what Colab pins.

``make colab-check`` proves it by installing; these tests check the declarations it relies on, fast.
"""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from colab_stack import changed, normal, pins

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]


def test_dev_is_the_union_of_the_other_extras():
    union = {normal(Requirement(r).name): Requirement(r).specifier for name in ("test", "lab", "browser", "instructor")
             for r in EXTRAS[name]}
    dev = {normal(Requirement(r).name): Requirement(r).specifier for r in EXTRAS["dev"]}
    assert dev == union


def test_colab_pins_satisfy_labkit_and_its_test_extra():
    colab = pins()
    for text in PROJECT["dependencies"] + EXTRAS["test"]:
        requirement = Requirement(text)
        if normal(requirement.name) in colab:
            assert requirement.specifier.contains(colab[normal(requirement.name)]), (requirement, "Colab pins",
                                                                                    colab[normal(requirement.name)])
    assert not any(normal(Requirement(r).name) == "jupyterlab" for r in EXTRAS["test"])  # needs jupyter-client 7+


def test_a_changed_pin_is_named():
    assert changed({"traitlets": "5.7.1"}, {}) == ["traitlets: Colab has 5.7.1, now not installed"]
    assert changed({"numpy": "2.0.2"}, {"numpy": "2.0.2"}) == []


def test_the_transformers_floor_is_the_version_colab_check_runs():
    floor = next(Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == "transformers")
    assert str(floor.specifier) == f">={pins()['transformers']}"
