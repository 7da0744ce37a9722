"""What the hyper-connection tests share (test_hyper_connections.py, test_kernels_hyper_connections.py)."""
import torch


def randomise(model: torch.nn.Module) -> None:
    """Every hyper-connection weight (static, dynamic, scales, stream norms) drawn away from its initialisation."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(key in name for key in ("static_", "dynamic_weight", "_scale", "stream_norm")):
                p.copy_(torch.randn_like(p) * (0.3 if "dynamic_weight" in name else 1.0))
