"""A plug-in that registers nothing: what a test loads in its own process without changing any registry."""
