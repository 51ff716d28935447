"""Training the embedded default model family (docs/study.md): Llama checkpoints on stdlib code."""
