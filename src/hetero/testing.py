"""Test doubles: an emulated fleet, a manual clock, an emulated inference replica and fake NVML
boxes, for tests, demos and benchmarks on machines without accelerators.

- ``emulated_fleet(speeds, memory=None, model=...)``: emulated devices ``d0``, ``d1``, … of a
  catalog model (or a ``DeviceSpec``) at the given relative speeds, capped in memory if asked
  (``hetero.devices.emulated``); a fleet config entry with ``emulate: true`` (see
  docs/config.md) builds alike devices from a file, named ``a100-80gb:0``, … instead.
- ``ManualClock``: time that moves only when told (``advance``, ``set``); its ``now`` is the
  ``Clock`` a dispatcher or policy reads, and the zero-argument callable that the engine model
  and the rate limiter take (``hetero.sched.clock``).
- ``MockReplica`` / ``MockConfig``: a real OpenAI-compatible HTTP server that takes as long as a
  replica of a given speed would, and speaks the load endpoints of vLLM or SGLang
  (``hetero.serve.emulator``; ``hetero mock-replica`` runs one from the command line).
- ``FakeNVML`` and the built-in boxes ``mixed_box()``, ``nvswitch_box()``, ``pcie_box()`` and
  ``mig_box()`` (GPUs split into MIG slices, ``FakeMigDevice``): a box of GPUs described without
  one, to pass to ``get_device_list(nvml=...)`` or ``read_topology(nvml=...)``
  (``hetero.devices.fake_nvml``).

Names load on first use, so ``import hetero.testing`` does not import aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from hetero._lazy import lazy_exports

#: Each name and the module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "emulated_fleet": "hetero.devices.emulated",
    "FakeGPU": "hetero.devices.fake_nvml",
    "FakeMigDevice": "hetero.devices.fake_nvml",
    "FakeNVML": "hetero.devices.fake_nvml",
    "FakeTopology": "hetero.devices.fake_nvml",
    "mig_box": "hetero.devices.fake_nvml",
    "mixed_box": "hetero.devices.fake_nvml",
    "nvswitch_box": "hetero.devices.fake_nvml",
    "pcie_box": "hetero.devices.fake_nvml",
    "ManualClock": "hetero.sched.clock",
    "MockConfig": "hetero.serve.emulator.config",
    "MockReplica": "hetero.serve.emulator.server",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

if _TYPE_CHECKING:
    # What type checkers read in place of the lazy look-up: ``_EXPORTS`` again, as explicit
    # re-exports. Nothing here runs; tests/test_public_api.py checks that both say the same.
    from hetero.devices.emulated import emulated_fleet as emulated_fleet
    from hetero.devices.fake_nvml import FakeGPU as FakeGPU
    from hetero.devices.fake_nvml import FakeMigDevice as FakeMigDevice
    from hetero.devices.fake_nvml import FakeNVML as FakeNVML
    from hetero.devices.fake_nvml import FakeTopology as FakeTopology
    from hetero.devices.fake_nvml import mig_box as mig_box
    from hetero.devices.fake_nvml import mixed_box as mixed_box
    from hetero.devices.fake_nvml import nvswitch_box as nvswitch_box
    from hetero.devices.fake_nvml import pcie_box as pcie_box
    from hetero.sched.clock import ManualClock as ManualClock
    from hetero.serve.emulator.config import MockConfig as MockConfig
    from hetero.serve.emulator.server import MockReplica as MockReplica
