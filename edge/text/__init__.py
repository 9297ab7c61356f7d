"""Text in and out of the model: the tokenizer (a checkpoint's Hugging Face tokenizer files, matching transformers),
chat templates rendered as transformers renders them (in a sandbox, with time and size limits), and stop strings over
streamed text."""
