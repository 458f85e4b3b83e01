"""Reward functions (scored on decoded final samples), their registry, and the remote reward service."""
