"""Metrics, traces, Gantt charts and plots."""
