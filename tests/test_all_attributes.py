"""Every public package's ``__all__`` is a tuple of names that exist, and
lists every public class and function meshio defines there."""

from __future__ import annotations

import importlib
import inspect

import pytest

PACKAGES = ("meshio", "meshio.endpoints", "meshio.jobs", "meshio.supervision", "meshio.rdma",
            "meshio.testing")


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_a_tuple_of_unique_names(package: str) -> None:
    module = importlib.import_module(package)
    assert isinstance(module.__all__, tuple)
    assert all(isinstance(name, str) for name in module.__all__)
    duplicates = sorted({name for name in module.__all__ if module.__all__.count(name) > 1})
    assert not duplicates, f"{package}.__all__ lists {duplicates} more than once"


@pytest.mark.parametrize("package", PACKAGES)
def test_all_attributes_exist(package: str) -> None:
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ lists names it does not define: {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_complete(package: str) -> None:
    module = importlib.import_module(package)
    unlisted = []
    for name in dir(module):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # submodules, constants
        defined_in = getattr(obj, "__module__", "") or ""
        if (defined_in == "meshio" or defined_in.startswith("meshio.")) and (
                name not in module.__all__):
            unlisted.append(name)
    assert not unlisted, f"public names missing from {package}.__all__: {sorted(unlisted)}"


def test_reexports_are_the_same_objects() -> None:
    import meshio
    import meshio.endpoints
    import meshio.supervision

    for sub in (meshio.endpoints, meshio.supervision):
        for name in sub.__all__:
            if name in meshio.__all__:
                assert getattr(sub, name) is getattr(meshio, name), f"{sub.__name__}.{name}"
