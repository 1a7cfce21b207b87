"""The public API is one table per lazy package, every error the library raises on purpose is a
``hetero.errors`` class, and each concept has one name."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import hetero
import hetero.errors
from hetero.errors import ConfigError, HeteroError

SRC = Path(hetero.__file__).parent

# Packages whose names load on first use (hetero.runtime is left to its own tests while it moves).
LAZY = ["hetero", "hetero.testing", "hetero.serve", "hetero.devices", "hetero.train"]


def _type_checking_imports(module: str) -> dict[str, str]:
    """name -> module of every import in the module's ``if TYPE_CHECKING:`` block."""
    path = Path(importlib.import_module(module).__file__ or "")
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom), ast.unparse(stmt)
                for alias in stmt.names:
                    # Explicit re-exports keep their name (``import X as X``).
                    assert alias.asname in (None, alias.name), ast.unparse(stmt)
                    found[alias.name] = str(stmt.module)
    return found


@pytest.mark.parametrize("module", LAZY)
def test_what_type_checkers_see_is_the_lazy_table(module: str) -> None:
    package = importlib.import_module(module)
    assert _type_checking_imports(module) == package._EXPORTS
    extra = ["__version__"] if module == "hetero" else []
    assert sorted(package.__all__) == sorted([*package._EXPORTS, *extra])


def test_the_top_level_all_is_the_table_and_version() -> None:
    assert hetero.__all__ == sorted([*hetero._EXPORTS, "__version__"])
    for name, module in hetero._EXPORTS.items():
        assert getattr(hetero, name) is getattr(importlib.import_module(module), name), name


def test_test_doubles_live_in_hetero_testing() -> None:
    import hetero.serve
    import hetero.serve.emulator.server
    import hetero.testing

    assert "MockReplica" not in hetero.__all__
    assert "MockConfig" not in hetero.__all__
    server = hetero.serve.emulator.server
    assert hetero.testing.MockReplica is hetero.serve.MockReplica is server.MockReplica
    assert hetero.testing.MockConfig is server.MockConfig
    assert len(hetero.testing.mixed_box().gpus) == 4
    assert not hasattr(hetero.testing, "no_such_name")


def _defined_error_classes() -> list[tuple[str, str]]:
    """(file, class) of every class outside errors.py whose base is a hetero error."""
    errors = set(hetero.errors.__all__)
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases}
                if bases & errors or any(b.startswith("hetero.errors.") for b in bases):
                    found.append((str(path.relative_to(SRC)), node.name))
    return found


def test_every_hetero_error_is_defined_in_errors_py_and_public() -> None:
    assert _defined_error_classes() == []
    classes = [
        obj
        for _, obj in inspect.getmembers(hetero.errors, inspect.isclass)
        if issubclass(obj, HeteroError) and obj.__module__ == "hetero.errors"
    ]
    assert sorted(c.__name__ for c in classes) == hetero.errors.__all__
    for cls in classes:
        assert cls.__doc__, cls.__name__
        assert hetero._EXPORTS.get(cls.__name__) == "hetero.errors", cls.__name__


def test_moved_errors_are_still_importable_where_they_were() -> None:
    from hetero.plan import InfeasiblePlan as PlanInfeasible
    from hetero.plan.sizing import InfeasiblePlan
    from hetero.sched import Rejected as SchedRejected
    from hetero.sched.policy import Rejected
    from hetero.serve import NoReplica as ServeNoReplica
    from hetero.serve import UnknownModel as ServeUnknownModel
    from hetero.serve.router import NoReplica, UnknownModel

    assert InfeasiblePlan is PlanInfeasible is hetero.errors.InfeasiblePlan
    assert Rejected is SchedRejected is hetero.errors.Rejected
    assert NoReplica is ServeNoReplica is hetero.errors.NoReplica
    assert UnknownModel is ServeUnknownModel is hetero.errors.UnknownModel
    assert issubclass(InfeasiblePlan, hetero.errors.AllocationError)
    assert issubclass(Rejected, hetero.errors.NoCapableDevice)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: hetero.parse_size("1 lb"), "unknown unit 'lb'"),
        (lambda: hetero.parse_size(None), "invalid size None"),
        (lambda: hetero.set_log_level("LOUD"), "invalid log level 'LOUD'"),
        (lambda: hetero.CostModel(prefill=-1), "CostModel.prefill must be >= 0"),
        (lambda: hetero.PerfModel([], alpha=2), "PerfModel alpha must be in (0, 1]"),
        (lambda: hetero.get_catalog().get("T4").peak_tflops("fp5"), "unknown dtype 'fp5'"),
        (lambda: hetero.plan_fleet(None, cap_scale=0), "cap_scale must be in (0, 1]"),  # type: ignore[arg-type]
    ],
)
def test_bad_input_to_public_functions_is_a_hetero_error_and_still_a_value_error(
    call: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("]", r"\]")) as err:
        call()  # type: ignore[operator]
    assert isinstance(err.value, HeteroError) and isinstance(err.value, ValueError)


def test_a_policy_built_with_a_bad_option_is_a_config_error() -> None:
    from hetero.sched.policies import AffinityFilter, CapacityFilter, Weighted

    for build in (
        lambda: CapacityFilter("later"),
        lambda: AffinityFilter({}),
        lambda: Weighted(by="colour"),
    ):
        with pytest.raises(ConfigError, match="option "):
            build()


def test_the_affinity_policy_has_its_own_name() -> None:
    import hetero.sched.policies as policies
    from hetero.sched.registry import policy_class

    assert policy_class("affinity") is policies.AffinityPolicy
    assert not hasattr(policies, "Affinity")
    assert hetero.Affinity.__module__ == "hetero.plan.request"
