"""Decoding a task's prompts with several policies side by side with greedy `ar` (`side_by_side`), in the
balanced order every timed comparison uses (`run_order`), and the task quality every run reports."""
