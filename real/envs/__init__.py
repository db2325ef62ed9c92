"""Agent environments (coding, lookup), their graders and the tool sandbox."""
