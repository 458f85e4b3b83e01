"""Sampling trajectories with log-probs, and the trajectory records."""
