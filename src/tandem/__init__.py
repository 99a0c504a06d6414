"""tandem: speculative decoding with cross-sequence batched verify."""
