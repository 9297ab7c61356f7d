"""The memory planner (SpecMemo-style): budgets weights, target/draft KV and draft buffers against the device.

Planned (issue "Step 5 of 7"). This package imports nothing from the rest of edge.
"""
