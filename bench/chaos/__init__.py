"""The chaos bench: the real stack driven through its public API and CLI while faults
are injected from outside (a disk filled by another file, processes and servers
killed with SIGKILL or frozen with SIGSTOP, stored files and objects damaged with
raw tools), with every loaded byte compared against what was stored.

    .venv/bin/python -m bench.chaos.run --profile short      # what the tests run
    .venv/bin/python -m bench.chaos.run --profile long --json bench/results/chaos.json

One module per scenario (`fs_full`, `fs_kills`, `s3_kill`, `s3_freeze`,
`redis_kill`, `redis_freeze`, `p2p_node`, `p2p_freeze`, `damage`), each
exposing `NAME`, `PROFILES` and `run(profile, workdir, seed) -> list[Row]`;
`driver` holds what they share (a tier driven job by job, its bytes checked),
`child` the writer process `fs_kills` kills, `report` the table and JSON. Run
from the repository root: scenarios reuse the tests' S3 servers
(`tests/s3/servers.py`), Redis server (`tests/redis/server.py`), cache nodes
(`tests/p2p/nodes.py`) and fs helpers.
"""
