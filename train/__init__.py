"""Training tools for edge's built-in model: the corpus builder, the tokenizer trainer and the model trainer."""
