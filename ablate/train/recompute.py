"""`train.activation_checkpointing`: each decoder block's activations recomputed in the backward instead of
kept (torch.utils.checkpoint, non-reentrant), for any strategy.

Written here rather than with torch's `checkpoint_wrapper`: the wrapper puts each block under a
`_checkpoint_wrapped_module` child, which renames every parameter (`blocks.0._checkpoint_wrapped_module.
attention...`) that the optimizer's parameter groups, the checkpoints and the layer statistics read by
name. Setting the block's own `forward` keeps the module tree and its names as they are; under FSDP2 the
block's all-gather hooks stay outside the recomputed region, as with the wrapper (torchtitan's order).
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint


def recompute_blocks(model: nn.Module) -> None:
    """Each block of `model` (a DecoderLM) recomputes its forward in the backward, in place."""
    for block in model.blocks:
        if "forward" not in vars(block):  # once: a module built again is a new model
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
