"""The chat screen's parts: messages, the prompt input, the stats panel and the memory bar."""
