"""Run by tests/vllm/test_upgrade.py under another vLLM's interpreter: one engine of
`level` computes the prompt of `seed` and stores it down to the fs tier at `root`.

    python -m tests.vllm.upgrade_writer LEVEL ROOT MODEL_DIR SEED

Prints the vLLM version it ran on."""

from __future__ import annotations

import importlib.metadata as md
import random
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    from tests.vllm.test_levels import BLOCKS, write
    from tests.vllm.test_spec import tokens

    level, root, model, seed = int(argv[0]), Path(argv[1]), Path(argv[2]), int(argv[3])
    write(model, level, root, tokens(random.Random(seed), BLOCKS))
    print(md.version("vllm"))


if __name__ == "__main__":
    main(sys.argv[1:])
