"""Placeholder: filled in by issue 15's work on the language-model family."""
