"""A pulling engine in a process of its own: `python -m tests.p2p.puller SPEC_JSON`.

SPEC_JSON: {"tier": {...p2p options, with peers...}, "seed": str, "n": int,
"block_bytes": int}. Waits for its links, settles `keys_for(seed, n)`, loads
the hits and compares their bytes with `block_data`; prints one JSON line
{"ready": bool, "answers": [...], "verified": int, "wrong": int, "state": str,
"reason": str, "plane": str}.
"""

from __future__ import annotations

import json
import sys

from kvtiers.contract.lookup import LookupResult

from tests.p2p.engine import BB, Engine, block_data, keys_for


def main() -> None:
    spec = json.loads(sys.argv[1])
    engine = Engine(spec["tier"], block_bytes=spec.get("block_bytes", BB))
    try:
        ready = engine.wait_ready(timeout=spec.get("ready_s", 20.0))
        keys = keys_for(spec.get("seed", "a"), spec.get("n", 8))
        answers = engine.settle(keys)
        hits = [k for k, a in zip(keys, answers, strict=True) if a is LookupResult.HIT]
        verified = wrong = 0
        if hits:
            slots = engine.mgr.prepare_load(hits)
            for key, slot in zip(hits, slots, strict=True):
                good = bytes(engine.pool.block(slot)) == block_data(key, engine.pool.block_bytes)
                verified += good
                wrong += not good
            engine.mgr.complete_load(hits)
        link = next(iter(engine.tier.links.values()), None)
        print(json.dumps({"ready": ready, "answers": [a.value for a in answers],
                          "verified": verified, "wrong": wrong,
                          "state": link.state if link else None,
                          "reason": link.reason if link else None,
                          "plane": link.plane if link else None}), flush=True)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
