"""What the front ends share: edge-chat (tui), edge-serve (serve) and edge-bench (bench) take the same command-line
options for which model to run, how to load it (dtype, device, weights, KV cache, drafter, draft length, memory
budget) and how to sample, and turn them into one `edge.LoadSpec` and one set of generation options
(options.py). It sits outside the runtime: edge never imports it, and it imports only edge, memory and kernels."""
