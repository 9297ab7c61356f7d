"""Running an exported bundle (written by edge-export): the bundle's manifest checked file by file, and its graphs
(ONNX Runtime, optimum's ONNX graphs, TorchScript and torch.export programs) behind the same calls as the torch
`Transformer`, so the engine and the drafters run them unchanged. Each backend's runtime is imported only when a
bundle asks for it."""
