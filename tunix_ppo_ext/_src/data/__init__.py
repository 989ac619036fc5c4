"""Trajectory containers, reward policies, score shaping, dynamic sampling, tokenizers (NumPy)."""
