"""Training of the shipped checkpoints: corpus -> tokenizer -> Llama 4 target -> EAGLE / EAGLE-3 heads."""
