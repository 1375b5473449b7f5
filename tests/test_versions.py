"""The jax range the book states is the range it is tested with, in every place it is stated."""

import re

from book.devices import TESTED_JAX, version_notice
from nbconventions import ROOT


def test_tested_range_matches_pyproject_floor_and_requirements_pin():
    pyproject = (ROOT / "pyproject.toml").read_text()
    requirements = (ROOT / "requirements.txt").read_text()
    (floor,) = re.findall(r'"jax>=([\d.]+)"', pyproject)
    (pin,) = re.findall(r"^jax==([\d.]+)$", requirements, re.M)
    (jaxlib_pin,) = re.findall(r"^jaxlib==([\d.]+)$", requirements, re.M)
    assert TESTED_JAX == (floor, pin) and jaxlib_pin == pin


def test_versions_inside_the_range_say_nothing():
    oldest, newest = TESTED_JAX
    assert version_notice(oldest) is None and version_notice(newest) is None
    assert version_notice("0.11.2", ("0.10.0", "0.12.0.1")) is None


def test_versions_outside_the_range_get_one_sentence_naming_it():
    for version in ("0.9.2", "0.12.1", "0.13.0.dev20270101", "1.0"):
        notice = version_notice(version, ("0.10.0", "0.12.0.1"))
        assert notice is not None and "\n" not in notice
        assert version in notice and "0.10.0 to 0.12.0.1" in notice


def test_a_dev_build_of_a_tested_release_is_inside():
    assert version_notice("0.12.0.1.dev20261120", ("0.10.0", "0.12.0.1")) is None
