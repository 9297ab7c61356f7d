"""The memory planner (SpecMemo-style): budgets weights, target/draft KV and draft buffers against the device.

`budget` reads sizes as people write them ("6GiB"); `footprint` counts the bytes of every part from shapes alone
(tested equal to what the engine allocates); `device` finds what the device has (CPU RAM within a container's cgroup
limit, CUDA free memory, or the user's budget); `plan` sizes what to allocate under a budget and, where it does not
fit, steps down in a fixed order (the draft model's weights and cache narrower, a shorter draft context, the n-gram
drafter, speculation off, a shorter context; on a GPU, offloaded layers last), recording each step and its reason.
This package imports nothing from the rest of edge.
"""
