"""Where a model comes from: a checkpoint folder read into the transformer (safetensors, never pickles), a GGUF file
from llama.cpp or Ollama (its settings, tokenizer and weights in their own quantization), a Hub id resolved through
the local Hugging Face cache, the packaged default model, and the built-in models shipped in edge/models/."""
