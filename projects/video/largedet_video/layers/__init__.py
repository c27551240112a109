from .batch_norm import NaiveSyncBatchNorm3d, convert_sync_batchnorm

__all__ = ["NaiveSyncBatchNorm3d", "convert_sync_batchnorm"]
from .subbatch_bn import (
    BNGrouping,
    SubBatchNorm2d,
    SubBatchNorm3d,
    SubBatchNormNd,
    bn_grouping,
    convert_from_subbatch_bn,
    convert_to_subbatch_bn,
    set_bn_grouping,
)

__all__ += [
    "BNGrouping",
    "SubBatchNorm2d",
    "SubBatchNorm3d",
    "SubBatchNormNd",
    "bn_grouping",
    "convert_from_subbatch_bn",
    "convert_to_subbatch_bn",
    "set_bn_grouping",
]
