"""Only the optional native helper; everything else is in pyproject.toml.

`kvtiers_fs.disk._readmany` (open and read a batch of block files without the GIL) is
built when a C compiler and Python's headers are there; without them the build
warns and goes on, and every load takes the Python path (same results, more CPU
per block).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvtiers_fs.disk._readmany",
            ["src/kvtiers_fs/disk/_readmany.c"],
            optional=True,
        )
    ]
)
