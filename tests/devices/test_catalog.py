from __future__ import annotations

import logging
import re

import pytest

from hetero import DeviceError, DeviceKind, get_catalog
from hetero.devices.catalog import Catalog, _normalize

REQUIRED = [
    "A100-40GB", "A100-80GB", "H100-SXM-80GB", "H100-PCIe-80GB", "H200-141GB", "B200", "L40S",
    "L4", "A10G", "T4", "V100-16GB", "V100-32GB", "RTX-3090", "RTX-4090", "MI250X", "MI300X",
    "Gaudi2", "Gaudi3", "TPU-v4", "TPU-v5e", "TPU-v5p", "Trainium", "Trainium2", "Inferentia2",
    "Cerebras-WSE-2", "Groq-LPU",
]  # fmt: skip


def test_catalog_has_the_required_rows_with_sources() -> None:
    catalog = get_catalog()
    assert len(catalog) >= 30
    for name in REQUIRED:
        spec = catalog.get(name)
        assert spec.source.startswith("https://"), name
        assert spec.memory_bytes > 0 and spec.memory_bandwidth_gbs > 0, name
        assert spec.peak_tflops("bf16") > 0, name
    assert catalog.price_date


@pytest.mark.parametrize(
    ("reported", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("Tesla T4", "T4"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIe-80GB"),
        ("AMD Instinct MI300X", "MI300X"),
        ("a100 80gb", "A100-80GB"),
        ("a100_80gb", "A100-80GB"),
    ],
)
def test_lookup_by_driver_names(reported: str, model: str) -> None:
    assert get_catalog().get(reported).model == model
    assert get_catalog().resolve(reported).model == model


# Names drivers and clouds use that only name one model: nvidia-smi (DGX Station V100s), AMD
# market names without the vendor (pci.ids, some rocm-smi), GCP/GKE accelerator types and TPU
# node labels, and the short forms people type (issue #8, point 6).
@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("H100-80GB", "H100-SXM-80GB"),
        ("H100 80GB", "H100-SXM-80GB"),
        ("H100 SXM5", "H100-SXM-80GB"),
        ("nvidia-h100-80gb", "H100-SXM-80GB"),
        ("nvidia-h100-mega-80gb", "H100-SXM-80GB"),
        ("NVIDIA_H100_80GB", "H100-SXM-80GB"),
        ("H100 80GB PCIe", "H100-PCIe-80GB"),
        ("nvidia-tesla-a100", "A100-40GB"),
        ("nvidia-a100-80gb", "A100-80GB"),
        ("A100 80GB PCIe", "A100-80GB"),
        ("nvidia-h200-141gb", "H200-141GB"),
        ("Tesla V100-DGXS-16GB", "V100-16GB"),
        ("Tesla V100-DGXS-32GB", "V100-32GB"),
        ("Instinct MI100", "MI100"),
        ("Instinct MI210", "MI210"),
        ("Instinct MI250X/MI250", "MI250X"),
        ("Instinct MI300X", "MI300X"),
        ("Instinct MI325X", "MI325X"),
        ("tpu-v4-podslice", "TPU-v4"),
        ("tpu-v5-lite-podslice", "TPU-v5e"),
        ("tpu-v5p-slice", "TPU-v5p"),
        ("tpu-v6e-slice", "TPU-v6e"),
    ],
)
def test_names_people_type_resolve(name: str, model: str) -> None:
    assert get_catalog().get(name).model == model
    assert get_catalog().resolve(name).model == model


def test_an_h100_without_form_factor_is_the_sxm_card() -> None:
    # nvidia-smi names only the SXM card without a form factor ("NVIDIA H100 80GB HBM3").
    catalog = get_catalog()
    for name in ("H100", "NVIDIA H100", "H100 80GB", "H100-80GB"):
        assert catalog.get(name).model == "H100-SXM-80GB", name
    assert catalog.get("NVIDIA H100 PCIe").model == "H100-PCIe-80GB"
    assert catalog.get("NVIDIA H100 NVL").model == "H100-NVL-94GB"


# Names of more than one card: refused, with every catalog model they could mean listed first.
@pytest.mark.parametrize(
    ("name", "candidates"),
    [
        ("A100", "A100-40GB, A100-80GB"),
        ("NVIDIA A100", "A100-40GB, A100-80GB"),
        ("V100", "V100-16GB, V100-32GB"),
        ("Tesla V100", "V100-16GB, V100-32GB"),
        ("nvidia-tesla-v100", "V100-16GB, V100-32GB"),
        ("nvidia-tesla-p100", "P100-16GB"),
        ("RTX 6000", "RTX-6000-Ada"),
        ("Gaudi", "Gaudi2, Gaudi3"),
    ],
)
def test_ambiguous_names_list_their_candidates(name: str, candidates: str) -> None:
    assert name not in get_catalog()
    message = re.escape(f"unknown device model {name!r}; closest: {candidates}")
    with pytest.raises(DeviceError, match=message):
        get_catalog().get(name)


def test_different_cards_never_share_a_name() -> None:
    catalog = get_catalog()
    for a, b in [
        ("H100 80GB", "H100 PCIe"),
        ("H100 80GB", "H100 NVL"),
        ("L40", "L40S"),
        ("A10", "A10G"),
        ("TPU v5", "TPU v5 lite"),
    ]:
        assert catalog.get(a).model != catalog.get(b).model, (a, b)
    # Cards the catalog has no row for stay unknown rather than borrow a sibling's figures.
    for name in ("MI250", "MI300", "MI300A", "NVIDIA H200 NVL", "Quadro RTX 6000"):
        assert name not in catalog


def test_every_alias_adds_a_name() -> None:
    for spec in get_catalog():
        names = [_normalize(n) for n in (spec.model, *spec.aliases)]
        assert len(names) == len(set(names)), spec.model


def test_unknown_name_falls_back_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hetero"):
        spec = get_catalog().resolve("NVIDIA Quantum 9000", DeviceKind.GPU)
    assert spec.model == "NVIDIA Quantum 9000"
    assert spec.kind is DeviceKind.GPU
    assert spec.peak_tflops("fp32") > 0
    assert "not in the catalog" in caplog.text and "NVIDIA Quantum 9000" in caplog.text


def test_get_unknown_suggests_closest() -> None:
    with pytest.raises(DeviceError, match=r"unknown device model 'A100-80G'.*A100-80GB"):
        get_catalog().get("A100-80G")


def test_dense_tflops_figures() -> None:
    catalog = get_catalog()
    assert catalog.get("A100-80GB").peak_tflops("fp16") == pytest.approx(312)
    assert catalog.get("V100-32GB").peak_tflops("fp16") == pytest.approx(125)
    assert catalog.get("H100-SXM-80GB").peak_tflops("fp8") == pytest.approx(1978.9, rel=0.01)
    # No published tf32 on a V100: falls back to fp32.
    assert catalog.get("V100-16GB").peak_tflops("tf32") == catalog.get("V100-16GB").peak_tflops(
        "fp32"
    )
    with pytest.raises(ValueError, match="unknown dtype 'fp12'"):
        catalog.get("T4").peak_tflops("fp12")


def test_compare_ranks_and_computes_ratios() -> None:
    rows = get_catalog().compare(dtype="bf16", kinds={DeviceKind.GPU})
    priced = [r for r in rows if r.tflops_per_dollar is not None]
    # Models with bf16 first, then those that run it in another format; each group best first.
    groups = [[r for r in priced if r.fallback is f] for f in (False, True)]
    assert priced == groups[0] + groups[1] and groups[1]
    for group in groups:
        assert [r.tflops_per_dollar for r in group] == sorted(
            (r.tflops_per_dollar for r in group), reverse=True
        )
    assert all(r.kind == "gpu" for r in rows)
    a100 = next(r for r in rows if r.model == "A100-80GB")
    assert a100.tflops_per_dollar == pytest.approx(312 / a100.price_per_hour, rel=0.01)
    assert a100.gb_per_tflops == pytest.approx(80 / 312, rel=0.01)
    by_watt = get_catalog().compare(by="tflops_per_watt")
    assert by_watt[0].tflops_per_watt == max(r.tflops_per_watt or 0 for r in by_watt)
    with pytest.raises(ValueError, match="unknown ranking 'speed'"):
        get_catalog().compare(by="speed")


def test_catalog_rejects_duplicate_names() -> None:
    row = """
  - {name: X1, vendor: v, kind: gpu, aliases: [Y], tflops: {fp32: 1}, memory_gib: 1,
     memory_bandwidth_gbs: 1, source: "https://x"}"""
    with pytest.raises(DeviceError, match="name 'Y' used by both"):
        Catalog.from_yaml("accelerators:" + row + row.replace("X1", "X2"))
