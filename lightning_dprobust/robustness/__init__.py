"""Robustness: attacks that run on their own randomness, and the separability rule for attacks on private data."""
