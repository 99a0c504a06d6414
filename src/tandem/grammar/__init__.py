"""Structured outputs: grammar constraints, compiled once (llguidance), masking the picks."""
