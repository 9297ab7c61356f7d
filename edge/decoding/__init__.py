"""Decoding: the plain loop (loop.py), speculative decoding (draft, verify in one target pass, accept) and its pure
verifiers, the sampler, output constrained by a grammar (structured output, and tool calls forced and read back),
the drafters (drafters/) and the registry that parses a drafter spec and builds it (registry.py)."""
