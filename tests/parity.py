"""What the encoder parity tests share: saving a transformers reference both ways, and the two measures."""

import numpy as np


def save_reference(model, folder, fmt):
    """``save_pretrained`` (safetensors), or the state dict as a legacy ``pytorch_model.bin`` beside config.json
    (transformers 5 writes safetensors only; released checkpoints such as DeBERTa-v3's are .bin files like this)."""
    if fmt == "safetensors":
        model.save_pretrained(folder)
    else:
        import torch

        folder.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(folder)
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder


def real_diff(ours, expected, mask) -> float:
    """Max |ours - expected| over real tokens; arrays are (batch, seq, ...), ``expected`` numpy or torch."""
    expected = expected.detach().numpy() if hasattr(expected, "detach") else np.asarray(expected)
    return float(np.abs(np.array(ours) - expected)[np.asarray(mask).astype(bool)].max())


def relative_errors(got: dict, expected: dict) -> dict[str, float]:
    """Per weight: max |difference| divided by that weight's largest |expected gradient| where that exceeds 1
    (absolute below 1; float32 summation order alone moves gradients in the hundreds by ~1e-4)."""
    return {k: float(np.abs(np.array(got[k]) - expected[k]).max() / max(1.0, np.abs(expected[k]).max()))
            for k in expected}
