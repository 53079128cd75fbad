"""How blocks are laid out as objects (the `layout` options choose between them):
the bytes of each object and where it lives under the prefix.

- `codec`: the block record - one block, self-describing and verifiable on its own;
  an object of the per-block layout is exactly one record.
- `segment`: the packed segment - several records in one object, an index in front.
- `names`: where objects live under the tier's prefix, and the only parser of names.
- `proof`: whether an object whose magic is damaged is still provably the tier's.

Pure functions, any thread: no I/O, no state.
"""
