"""Only the optional native helper; everything else is in pyproject.toml.

`kvtiers.swap._memcpy` (a batched memcpy for the CPU swapper) is built when a C
compiler and Python's headers are there; without them the build warns and goes on,
and the swapper uses its numpy path.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvtiers.swap._memcpy",
            ["src/kvtiers/swap/_memcpy.c"],
            optional=True,
        )
    ]
)
