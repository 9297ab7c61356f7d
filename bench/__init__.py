"""edge-bench: measure decoding speed and memory of edge (and peers, where installed) side by side."""
