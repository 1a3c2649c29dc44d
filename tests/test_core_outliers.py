"""The one definition of a massive activation: relative to its sequence's median, above an absolute floor."""

import pytest
import torch

from labkit.core.outliers import massive_mask


def test_the_mask_is_relative_to_each_sequence_median():
    x = torch.ones(2, 4, 8)
    x[0, 0, 3] = 2000.0  # 2000 x the median, above the floor of 100
    x[1] = 0.01
    x[1, 2, 5] = 50.0  # 5000 x its median but under the floor
    assert massive_mask(x).nonzero().tolist() == [[0, 0, 3]]
    with pytest.raises(ValueError, match="ratio must be"):
        massive_mask(x, ratio=0.5)
