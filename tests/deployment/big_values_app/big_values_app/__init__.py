"""A test app whose records carry large ``bytes`` and ``str`` values."""
