"""Only the optional native helper; everything else is in pyproject.toml.

`kvtiers.swap._memcpy` (a batched memcpy for the CPU swapper) and
`kvtiers.manager._slotops` (the CPU pool's per-block hold/state loops) and
`kvtiers.policies._slotlinks` (the slot policies' list moves) and
`kvtiers.sdk._blocksums` (many blocks' checksums per call) are built when
a C compiler and Python's headers are there; without them the build warns and goes
on, and the swapper and the pool use their Python paths.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvtiers.swap._memcpy",
            ["src/kvtiers/swap/_memcpy.c"],
            optional=True,
        ),
        Extension(
            "kvtiers.manager._slotops",
            ["src/kvtiers/manager/_slotops.c"],
            optional=True,
        ),
        Extension(
            "kvtiers.sdk._blocksums",
            ["src/kvtiers/sdk/_blocksums.c"],
            libraries=["dl"],
            optional=True,
        ),
        Extension(
            "kvtiers.policies._slotlinks",
            [
                "src/kvtiers/policies/_slotlinks.c",
                "src/kvtiers/policies/slotlinks_ghosts.c",
                "src/kvtiers/policies/slotlinks_index.c",
            ],
            depends=["src/kvtiers/policies/slotlinks.h"],
            optional=True,
        ),
    ]
)
