"""The object store client side: how the tier talks to the server.

- `connect`: the clients built from `S3Settings` - the fsspec filesystem the data
  path runs on, and a boto3 client for what fsspec does not offer.
- `objects`: `ObjectStore`, the handful of object operations the tier makes (put,
  get, size, delete, list), as coroutines on the tier's event loop.
- `body`: `PartsBody`, a request body sent from where its parts lie.
- `bucket`: bucket creation and the namespace's lifecycle (TTL) rule, through boto3.

Knows nothing of blocks, records or the index: bytes and names in, bytes out.
"""
