"""helix."""
