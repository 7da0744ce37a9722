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


def stream_dtype_error(method: str, section: dict, stream_dtype: str, layers: int = 4, length: int = 16,
                       device: str = "cpu") -> tuple[float, torch.dtype, bool]:
    """A tiny LM whose n streams are stored in ``stream_dtype``, against the same model with the input's (float32):
    ``(the logits' largest difference over their largest entry, the recorded states' dtype, every gradient
    finite)``. Weights moved 0.1 off their initialisation (at initialisation every stream is the plain model's),
    then the model moved to ``device`` (the kernels' tests: a GPU where there is one)."""
    from helpers.lm import lm
    tokens = torch.randint(0, 40, (2, length), generator=torch.Generator().manual_seed(0))
    results = []
    for dtype in (None, stream_dtype):
        model = lm(enc_layers=layers, **{method: {**section, "stream_dtype": dtype}})
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if any(key in name for key in ("static", "dynamic_weight", "_scale", ".phi")):
                    p.add_(torch.randn(p.shape, generator=generator) * 0.1)
        model = model.to(device)
        out = model(tokens.to(device), labels=tokens.to(device))
        out.loss.backward()
        finite = all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
        results.append((out.logits.detach(), out.encoder.states[-1].dtype, finite))
    (reference, _, _), (logits, states_dtype, finite) = results
    return ((logits - reference).abs().max() / reference.abs().max()).item(), states_dtype, finite
