"""Drafters: who proposes the tokens the target verifies. Built only by drafters.factory."""
