"""Executor-side training code: data feed, training loop, communication backends."""
