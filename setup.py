"""The one compiled module, the scheduler's hot paths (``hetero.sched._kernel``: placement
scores, and the engine fit's update); everything else is in pyproject.toml. ``optional``:
without a C compiler the package installs all the same, ``FleetView`` computes the same scores
with numpy and ``LinearFit`` the same updates in Python."""

from __future__ import annotations

import sys

import numpy
from setuptools import Extension, setup

# A fused multiply-add would round differently from numpy and Python, which the kernel matches
# bit for bit.
FLAGS = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off"]

setup(
    ext_modules=[
        Extension(
            "hetero.sched._kernel",
            ["src/hetero/sched/_kernel.c"],
            include_dirs=[numpy.get_include()],
            extra_compile_args=FLAGS,
            optional=True,
        )
    ]
)
