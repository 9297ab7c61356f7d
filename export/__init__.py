"""edge-export: package a checkpoint into a validated bundle (quantized ONNX / TorchScript, trimmed drafter).

Not built yet: see `export.cli` for what the command says today.
"""
