"""GPU kernels (Triton/CUDA) with plain-torch reference implementations and a dispatcher.

Planned (issue "Step 7 of 7"). This package imports nothing from the rest of edge.
"""
