"""The seed's attach_uneven_dtensor_metadata: DCP sees a packed piece as the chunk it is."""

from __future__ import annotations

import torch

def attach_uneven_dtensor_metadata(dtensor, row_offset: int):
    """Make DCP save and load `dtensor` as the chunk it really is: rows
    `[row_offset, row_offset + local rows)` of the global tensor, whatever its placements say
    (a packed buffer's pieces are not `torch.chunk` rows). Sets `__create_chunk_list__` and
    `__create_write_items__` on the local tensor, which DTensor forwards to. Returns dtensor."""
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                       TensorProperties)
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    local = dtensor._local_tensor
    offsets = torch.Size([int(row_offset)] + [0] * (local.dim() - 1))
    sizes = torch.Size(local.shape)
    global_size = torch.Size(dtensor.shape)

    def create_chunk_list():
        if local.numel() == 0:
            return []
        return [ChunkStorageMetadata(offsets=offsets, sizes=sizes)]

    def create_write_items(fqn, obj):
        if local.numel() == 0:
            return []
        return [WriteItem(index=MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                              properties=TensorProperties.create_from_tensor(local),
                              size=global_size))]

    local.__create_chunk_list__ = create_chunk_list
    local.__create_write_items__ = create_write_items
    return dtensor

