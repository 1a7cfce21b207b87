"""The one compiled module, the placement hot path (``hetero.sched._kernel``); everything else
is in pyproject.toml. ``optional``: without a C compiler the package installs all the same and
``FleetView`` computes the same scores with numpy."""

from __future__ import annotations

import sys

import numpy
from setuptools import Extension, setup

# A fused multiply-add would round differently from numpy, which the kernel matches bit for bit.
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
