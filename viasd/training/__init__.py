"""Training the embedded default model family (DESIGN.md §3): Llama checkpoints on stdlib code."""
