"""Prompt sets ("tasks"): which prompts a step trains on and which fixed prompts evaluation uses (``base.Task``)."""
