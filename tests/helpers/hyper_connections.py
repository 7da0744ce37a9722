"""What the hyper-connection and mHC tests share (test_hyper_connections.py, test_kernels_hyper_connections.py,
test_mhc.py)."""
import torch


def randomise(model: torch.nn.Module) -> None:
    """Every hyper-connection weight (static, dynamic, scales, stream norms) drawn away from its initialisation."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(key in name for key in ("static_", "dynamic_weight", "_scale", "stream_norm")):
                p.copy_(torch.randn_like(p) * (0.3 if "dynamic_weight" in name else 1.0))


def randomise_mhc(model: torch.nn.Module, scale: float = 1.0) -> None:
    """The mHC weights drawn away from their initialisation: biases, gates and projections."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".static"):
                p.copy_(torch.randn_like(p) * scale)
            elif name.endswith(".alpha"):
                p.copy_(torch.rand_like(p) + 0.5)
            elif name.endswith(".phi"):
                p.copy_(torch.randn_like(p) * 0.1 * scale)
