"""The verify step: accept walk, verdicts, commit, emit, propose."""
