"""Position-wise feed-forward block: ``W2 act(W1 x)`` (Vaswani et al. 2017, Eq. 2); fairseq names fc1/fc2."""
from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

# "gelu" is the exact erf form (BERT, nanoGPT's nn.GELU); "gelu_tanh" the tanh approximation of GPT-2's weights.
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": partial(F.gelu, approximate="tanh")}


class FeedForward(nn.Module):
    """The position-wise feed-forward block ``fc2(dropout(act(fc1(x))))`` (Vaswani et al. 2017, Eq. 2),
    Xavier-initialised with zero biases as fairseq; the names ``fc1``/``fc2`` are what weight-sharing methods tie."""

    def __init__(self, d_model: int, d_ffn: int, *, activation: str = "relu", act_dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ffn, bias=bias)
        self.fc2 = nn.Linear(d_ffn, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]
        self.act_dropout = nn.Dropout(act_dropout)
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            if fc.bias is not None:
                nn.init.zeros_(fc.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act_dropout(self.activation(self.fc1(x))))

    def traffic(self, batch: int, length: int, width: int) -> dict[str, float]:
        """Bytes a training step must move for the saved activations (:func:`interlayer.accounting.step_cost`): the
        first product's output and the activation's, written forward, read backward."""
        return {"activations": 2.0 * width * batch * length * 2 * self.fc1.out_features}

    def madds(self, t: int) -> int:
        return t * (self.fc1.in_features * self.fc1.out_features + self.fc2.in_features * self.fc2.out_features)
