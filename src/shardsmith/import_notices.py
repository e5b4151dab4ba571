"""Notices other libraries print while they import, which say nothing to a shardsmith user.

Contract
- ``quiet_import_notices()``: raise to ERROR the loggers of the notices below, so they no longer reach a
  command's stderr. Called by the CLI and by every process it starts that loads models (GPU workers). A
  library caller of :func:`shardsmith.build.build` keeps its own logging as it set it.

The notices (with ``shardsmith[quant]``, its pinned torchao beside its pinned torch):
- torchao, on import: "Failed to load .../torchao/_C*.so": optional C kernels built for another torch.
  The weight-only quantisation that shardsmith runs (``models.text.quantize``) needs none of them.
- diffusers, on import (when torchao is installed): "Unable to import `torchao` Tensor objects. This may
  affect loading checkpoints serialized with `torchao`": shardsmith loads no torchao-serialised checkpoint.
- torch, while torchao registers its enums: "<enum ...> is an Enum subclass and is now natively supported
  by torch.compile": a deprecation notice addressed to torchao.
"""

from __future__ import annotations

import logging

LOGGERS = ("torchao", "diffusers.quantizers.torchao", "torch.utils._pytree")


def quiet_import_notices() -> None:
    for name in LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
