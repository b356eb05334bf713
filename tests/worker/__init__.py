"""Worker engine tests."""
