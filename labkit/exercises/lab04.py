"""Lab 04's exercises: a prediction checked on the outlier visualizer.

Each exercise's task text in ``notebooks/solutions/04_outliers_quantization.ipynb`` states the rules used here.
"""

from __future__ import annotations

import functools

import torch

from labkit.core.quantization import outlier_channels
from labkit.exercises import register
from labkit.exercises.checking import prediction


# --------------------------------------------------------------------------------------------------------------
# 04.predict_outlier_channels: predict, then check on the visualizer

PREDICT_PROMPT = "The Eiffel Tower is in Paris. It was finished in 1889 and is 330 metres tall."
PREDICT_LAYER, PREDICT_THRESHOLD = 15, 6.0


@functools.lru_cache(maxsize=1)
def _linear_input() -> torch.Tensor:
    from labkit import runtime
    from labkit.runtime.models import load_model
    from labkit.runtime.quantize import linear_inputs

    lm = load_model(progress=False)
    name = f"{runtime.layer_names(lm)[PREDICT_LAYER]}.self_attn.q_proj"  # k_proj and v_proj read the same tensor
    return linear_inputs(lm, name, lm.text_ids(PREDICT_PROMPT)[0])  # [tokens, 576]


def outlier_channels_on_the_model() -> float:
    """How many of the 576 input channels of layer 15's q/k/v_proj reach |x| >= 6 on the visualizer's prompt: the
    channels LLM.int8() would keep in float there."""
    return float(outlier_channels(_linear_input(), PREDICT_THRESHOLD).sum())


PREDICT = register(prediction(
    "04.predict_outlier_channels", "Predict, then check: q/k/v_proj input channels reaching 6.0 at layer 15",
    "predicted_outlier_channels", outlier_channels_on_the_model,
    rtol=0.5,  # within a factor of two: |prediction - truth| <= max(prediction, truth) / 2
    asked=f"layer {PREDICT_LAYER}, input of q/k/v_proj, threshold {PREDICT_THRESHOLD}, prompt {PREDICT_PROMPT!r}",
    hint="return your prediction as a number of channels (of 576); the Linear reads the residual stream divided "
         "by each token's RMS (RMSNorm), and a channel counts once any token reaches the threshold"))

__all__ = ["PREDICT", "outlier_channels_on_the_model"]
