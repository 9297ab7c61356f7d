"""The memory planner (SpecMemo-style): budgets weights, target/draft KV and draft buffers against the device.

Built so far: `budget` (sizes such as "6GiB"), `footprint` (the bytes of every part, counted from shapes; tested
equal to what the engine allocates), `device` (CPU RAM with cgroup limits, CUDA free memory, or a budget). The plan
with its step-down order, and the engine allocating from it, come next (issue "Step 5 of 7").
This package imports nothing from the rest of edge.
"""
