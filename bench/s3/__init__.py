"""The pieces of bench/s3_bench.py and bench/s3_store_ab.py, one concept a module:
`clients` (the raw S3 clients), `passes` (one store-and-load pass of raw clients
and layouts), `tier` (the tier's own passes, start-up, outage), `nixl` (vLLM's obj
tier's data path), `driver` (the runs over one server), `report` (percentiles,
the table, the JSON document). The scripts put the repository and the
distributions' sources on `sys.path` before importing these."""
