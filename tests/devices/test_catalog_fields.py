"""The catalog's chip fields (architecture, compute capability, cores), TPU pod slices, the
compare table's dtype fallbacks and its rule-derived "best for" use classes."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from hetero.commands.catalog import register
from hetero.devices.catalog import USE_CLASSES, Catalog, best_for, figure_dtype, get_catalog
from hetero.devices.spec import DeviceKind, DeviceSpec
from hetero.devices.tpu_pod import parse_topology
from hetero.errors import DeviceError
from tests.cli_apps import command_app

app = command_app(register)
runner = CliRunner()
WIDE = {"COLUMNS": "200"}
_GIB = 1024**3


# --- architecture, compute capability, cores ---------------------------------------------------


@pytest.mark.parametrize(
    ("model", "architecture", "capability", "cuda", "tensor"),
    [
        ("A100-80GB", "Ampere", "8.0", 6912, 432),
        ("H100-SXM-80GB", "Hopper", "9.0", 16896, 528),
        ("H100-PCIe-80GB", "Hopper", "9.0", 14592, 456),
        ("L40S", "Ada Lovelace", "8.9", 18176, 568),
        ("T4", "Turing", "7.5", 2560, 320),
        ("V100-32GB", "Volta", "7.0", 5120, 640),
        ("P100-16GB", "Pascal", "6.0", 3584, 0),
        ("B200", "Blackwell", "10.0", None, None),  # NVIDIA publishes no core counts
        ("MI300X", "CDNA 3", "", None, None),  # CUDA's fields are NVIDIA's
    ],
)
def test_chip_fields_are_the_vendors(
    model: str, architecture: str, capability: str, cuda: int | None, tensor: int | None
) -> None:
    spec = get_catalog().get(model)
    assert (spec.architecture, spec.compute_capability) == (architecture, capability)
    assert (spec.cuda_cores, spec.tensor_cores) == (cuda, tensor)


def test_every_nvidia_gpu_has_an_architecture_and_a_compute_capability() -> None:
    nvidia = [s for s in get_catalog() if s.vendor == "NVIDIA" and s.kind is DeviceKind.GPU]
    assert len(nvidia) >= 20
    for spec in nvidia:
        major, minor = spec.compute_capability.split(".")
        assert spec.architecture and int(major) >= 6 and minor.isdigit(), spec.model
        assert (spec.cuda_cores is None) == (spec.tensor_cores is None), spec.model


def test_a_mig_slice_has_the_cores_of_its_sms() -> None:
    catalog = get_catalog()
    third = catalog.get("A100-80GB/3g.40gb")  # 42 of 108 SMs, 64 CUDA and 4 Tensor Cores each
    assert (third.architecture, third.compute_capability) == ("Ampere", "8.0")
    assert (third.cuda_cores, third.tensor_cores) == (42 * 64, 42 * 4)
    whole = catalog.get("H100-SXM-80GB/7g.80gb")  # all 132 SMs
    assert (whole.cuda_cores, whole.tensor_cores) == (16896, 528)


def test_a_bad_core_count_is_refused_naming_row_and_field() -> None:
    row = """
  - {name: X1, vendor: v, kind: gpu, tflops: {fp32: 1}, memory_gib: 1,
     memory_bandwidth_gbs: 1, cuda_cores: -3, source: "https://x"}"""
    with pytest.raises(DeviceError, match=r"X1: cuda_cores: expected a whole number >= 0, got -3"):
        Catalog.from_yaml("accelerators:" + row)


def test_show_prints_the_chip_fields() -> None:
    data = json.loads(runner.invoke(app, ["catalog", "show", "H100", "--json"]).stdout)
    assert data["architecture"] == "Hopper" and data["compute_capability"] == "9.0"
    assert (data["cuda_cores"], data["tensor_cores"]) == (16896, 528)
    assert data["best_for"] == ["training", "inference-large"]
    assert data["pod_chips"] is None and data["pod_slices"] is None
    table = runner.invoke(app, ["catalog", "show", "H100"], env=WIDE).stdout
    assert "Hopper" in table and "16,896" in table and "pod_slices" not in table


# --- TPU pod slices -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "topology", "chips", "hosts", "pod"),
    [
        ("v5p", "4x4x4", 64, 16, 8960),  # Google's v5p table: 64 chips, 16 hosts
        ("TPU-v5p", "16x16x24", 6144, 1536, 8960),  # the largest v5p slice
        ("v4", "2x2x1", 4, 1, 4096),
        ("v4", "8x8x8", 512, 128, 4096),
        ("v5e", "1x1", 1, 0.125, 256),  # 1/8 of a host
        ("v5e", "4x8", 32, 4, 256),
        ("v6e", "16x16", 256, 32, 256),
    ],
)
def test_a_slice_adds_up_its_chips(
    name: str, topology: str, chips: int, hosts: float, pod: int
) -> None:
    catalog = get_catalog()
    spec = catalog.get(name)
    got = catalog.tpu_slice(name, topology)
    assert (got.topology, got.chips, float(got.hosts), got.pod_chips) == (
        topology,
        chips,
        hosts,
        pod,
    )
    assert spec.pod_chips == pod
    assert got.memory_bytes == spec.memory_bytes * chips
    assert got.tflops["bf16"] == pytest.approx(spec.tflops["bf16"] * chips)
    assert math.prod(got.sides) == chips


def test_pods_are_3d_tori_for_v4_and_v5p_and_2d_for_v5e_and_v6e() -> None:
    catalog = get_catalog()
    dims = {m: catalog.pod_layout(m).dims for m in ("TPU-v4", "TPU-v5p", "TPU-v5e", "TPU-v6e")}  # type: ignore[union-attr]
    assert dims == {"TPU-v4": 3, "TPU-v5p": 3, "TPU-v5e": 2, "TPU-v6e": 2}
    assert catalog.pod_layout("A100-80GB") is None
    assert catalog.tpu_slice("v5p", "4×4×4") == catalog.tpu_slice("v5p", " 4 X 4 x 4 ")


@pytest.mark.parametrize(
    ("name", "topology", "text"),
    [
        ("v5p", "3x3x3", "TPU-v5p has no 3x3x3 slice; allowed TPU-v5p slices (3D torus): 2x2x1,"),
        ("v5p", "1x2x2", "did you mean 2x2x1?"),
        ("v5e", "2x2x2", "allowed TPU-v5e slices (2D torus): 1x1, 2x2, 2x4, 4x4"),
        ("v5p", "big", "'big' is not chips per side joined by x"),
        ("T4", "2x2", "T4 has no pod slices; models with pod slices: TPU-v4, TPU-v5e"),
        ("v9z", "2x2", "unknown device model 'v9z'"),
    ],
)
def test_a_bad_slice_is_refused_naming_the_allowed_ones(
    name: str, topology: str, text: str
) -> None:
    with pytest.raises(DeviceError) as info:
        get_catalog().tpu_slice(name, topology)
    assert text in str(info.value)


def test_a_side_of_zero_is_no_topology() -> None:
    with pytest.raises(DeviceError, match="side of 0 chips"):
        parse_topology("0x4")


def test_show_slice_cli() -> None:
    result = runner.invoke(app, ["catalog", "show", "v5p", "--slice", "4x4x4", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["chips"], data["hosts"], data["pod_chips"]) == (64, 16.0, 8960)
    assert data["tflops"]["bf16"] == pytest.approx(459 * 64)
    table = runner.invoke(app, ["catalog", "show", "v5e", "--slice", "1x1"], env=WIDE).stdout
    assert "1/8 (part of one host)" in table and "1 of a 256-chip pod" in table
    bad = runner.invoke(app, ["catalog", "show", "v5p", "--slice", "3x3x3"])
    assert bad.exit_code == 1
    assert "--slice 3x3x3: TPU-v5p has no 3x3x3 slice" in bad.stderr
    assert "2x2x1, 2x2x2, 2x4x4, 4x4x4" in bad.stderr
    assert "pod_slices" in runner.invoke(app, ["catalog", "show", "v4"], env=WIDE).stdout


# --- compare: what each device really has -------------------------------------------------------


def test_figure_dtype_names_the_format_a_figure_is_of() -> None:
    catalog = get_catalog()
    assert figure_dtype(catalog.get("T4"), "bf16") == "fp16"  # no BF16 on Turing
    assert figure_dtype(catalog.get("A100-80GB"), "bf16") == "bf16"
    assert figure_dtype(catalog.get("Gaudi2"), "fp64") is None


def test_compare_ranks_a_fallback_after_every_model_that_has_the_dtype() -> None:
    rows = get_catalog().compare(dtype="bf16", kinds={DeviceKind.GPU})
    t4 = next(r for r in rows if r.model == "T4")
    assert (t4.tflops, t4.tflops_dtype, t4.fallback) == (65.0, "fp16", True)
    native = [r for r in rows if not r.fallback and r.tflops_per_dollar is not None]
    # The T4's 186 fp16 TFLOPS per $ beats many bf16 figures, yet it ranks after all of them.
    assert any(r.tflops_per_dollar < t4.tflops_per_dollar for r in native)  # type: ignore[operator]
    assert rows.index(t4) > max(rows.index(r) for r in native)
    assert t4.to_dict()["tflops_dtype"] == "fp16"


def test_compare_table_marks_fallbacks_and_explains_them() -> None:
    args = ["catalog", "compare", "--dtype", "bf16", "--model", "T4", "--model", "A100-80GB"]
    result = runner.invoke(app, args, env=WIDE)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "│" in line and "model" not in line]
    assert "A100-80GB" in rows[0] and "T4" in rows[1]
    assert "65 (fp16)" in rows[1] and "(bf16)" not in rows[0]
    words = " ".join(result.stdout.split())
    assert "publishes no bf16 figure" in words and "rank after every model that has bf16" in words
    native = runner.invoke(app, ["catalog", "compare", "--dtype", "fp16", "--model", "T4"])
    assert "(fp16)" not in native.stdout and "publishes no" not in native.stdout


# --- best for -------------------------------------------------------------------------------


def _spec(**fields: object) -> DeviceSpec:
    base: dict[str, object] = {
        "model": "X",
        "kind": DeviceKind.GPU,
        "vendor": "v",
        "tflops": {"bf16": 200.0},
        "memory_bytes": 40 * _GIB,
        "memory_bandwidth_gbs": 1500.0,
        "interconnect_gbs": 600.0,
        "price_per_hour": 2.0,
    }
    return DeviceSpec(**{**base, **fields})  # type: ignore[arg-type]


def test_use_classes_follow_the_figures_not_the_name() -> None:
    assert best_for(_spec()) == ("training", "inference-small")
    assert "training" not in best_for(_spec(interconnect_gbs=64.0))  # PCIe only
    assert "training" not in best_for(_spec(tflops={"fp32": 500.0}))  # no 16-bit figure
    large = _spec(memory_bytes=80 * _GIB, memory_bandwidth_gbs=2000.0)
    assert best_for(large) == ("training", "inference-large")
    assert "budget" in best_for(_spec(price_per_hour=1.0))
    assert "budget" not in best_for(_spec(price_per_hour=None))
    assert best_for(_spec(tflops={"fp16": 20.0}, interconnect_gbs=0.0)) == ()


def test_use_classes_of_known_devices() -> None:
    catalog = get_catalog()
    assert best_for(catalog.get("H100-SXM-80GB")) == ("training", "inference-large")
    assert best_for(catalog.get("T4")) == ("inference-small", "budget")
    assert best_for(catalog.get("Inferentia2")) == ("inference-small",)  # a 192 GB/s link
    assert "training" in best_for(catalog.get("TPU-v5p"))
    rows = get_catalog().compare()
    assert all(r.best_for == best_for(catalog.get(r.model)) for r in rows)


def test_compare_shows_best_for_and_the_rules() -> None:
    result = runner.invoke(app, ["catalog", "compare", "--model", "H100", "--json"])
    assert json.loads(result.stdout)[0]["best_for"] == ["training", "inference-large"]
    table = runner.invoke(app, ["catalog", "compare", "--model", "T4"], env=WIDE).stdout
    assert "inference-small, budget" in table
    for use in USE_CLASSES:
        assert f"best for {use.name}: " in table
