"""The namespace of an SGLang server's pages: everything that makes two pages with
one hash incompatible.

Two SGLang servers of one model, parallel layout and page geometry share a tier's
pages (an fs root, a bucket); another model, another TP/PP/CP layout or rank, another
page size, dtype or host layout never sees them. The namespace records:

- the model: the config's `model` (kvtiers' `model` option) or SGLang's
  `model_name`;
- the page geometry (`BlockGeometry`: layers, heads, head size, dtype, tokens per
  page) and the host layout (the byte order inside a block);
- the shard: PP rank/size, attention CP rank/size, DCP rank/size and logical page
  size, and the TP rank/size for MHA (each TP rank holds its own heads). MLA KV is
  the same on every TP rank, so MLA leaves the TP rank out: every rank reads the
  one copy that the storage writer (`is_storage_writer`) stores.
"""

from __future__ import annotations

from typing import Any

from kvtiers import Namespace

from kvtiers_sglang.pages import PageShape

UNNAMED = "unnamed-model"


def shard_of(storage_config: Any) -> str:
    """The parallel shard a rank holds, as text (part of the namespace)."""
    c = storage_config
    parts = []
    if not c.is_mla_model:
        parts.append(f"tp{c.tp_rank}/{c.tp_size}")
    parts.append(f"pp{c.pp_rank}/{c.pp_size}")
    parts.append(f"cp{c.attn_cp_rank}/{c.attn_cp_size}")
    dcp_size = int(getattr(c, "dcp_size", 1) or 1)
    if dcp_size > 1:
        parts.append(f"dcp{c.dcp_rank}/{dcp_size}/page{c.logical_page_size}")
    return ",".join(parts)


def namespace_for(storage_config: Any, shape: PageShape, model: str | None = None) -> Namespace:
    """The namespace of this rank's pages (`model` overrides SGLang's model name)."""
    name = model or storage_config.model_name or UNNAMED
    kind = "mla" if storage_config.is_mla_model else "mha"
    revision = f"sglang;{kind};{shape.layout};{shard_of(storage_config)}"
    return Namespace(str(name), (shape.geometry,), revision=revision)
