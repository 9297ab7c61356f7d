"""edge-export: package a checkpoint into a validated bundle (quantized ONNX / TorchScript, trimmed drafter).

`edge.export.cli` is the command, `edge.export.bundle.export_bundle` the function behind it.
"""
