"""Classification head: spatial average pooling, dropout, a linear classifier,
and average consensus over the segments of a clip (TSN/TSM)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ClassificationHead"]


class ClassificationHead(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, dropout: float = 0.5):
        """
        Args:
            in_channels: channels of the backbone's features.
            num_classes: K.
            dropout: drop probability before the classifier (0 disables it).
        """
        super().__init__()
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(in_channels, num_classes)
        nn.init.normal_(self.fc.weight, std=0.01)
        nn.init.zeros_(self.fc.bias)

    def forward(self, features: torch.Tensor, num_clips: int) -> torch.Tensor:
        """Class scores (logits) per clip, ``(num_clips, K)``.

        ``features`` is either per-frame ``(num_clips*T, C, h, w)`` from a 2D
        backbone, classified frame by frame and averaged over the T segments
        (the consensus), or per-clip ``(num_clips, C, t, h, w)`` from a 3D one.
        Pooling is adaptive, so any frame size or clip length works.
        """
        if features.dim() == 5:
            pooled = features.mean(dim=(2, 3, 4))
            return self.fc(self.dropout(pooled))
        pooled = features.mean(dim=(2, 3))
        logits = self.fc(self.dropout(pooled))
        return logits.view(num_clips, -1, logits.shape[-1]).mean(dim=1)
