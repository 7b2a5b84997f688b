"""Models and tokenizers: the one model and tokenizer loader, the tiny model the CPU study builds, the Qwen-shaped
tokenizer, and vLLM's settings on the CPU."""
