"""edge-export: package a checkpoint into a validated bundle (quantized ONNX / TorchScript, trimmed drafter).

`export.cli` is the command, `export.bundle.export_bundle` the function behind it.
"""
