"""Errors every layer raises: on the ground floor, so that the algorithms, which the trainer's config imports,
can raise a config error without importing the trainer (an import circle they used to break with lazy imports)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config value that is wrong; `key` names it and the message says the value and what was expected."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"{key}: {detail}")
        self.key, self.detail = key, detail

    def __reduce__(self) -> tuple:
        """Rebuilt from its two fields when Ray carries it out of a trial's process: a failed trial's reason must
        be this message, not the TypeError of an exception that cannot be unpickled."""
        return type(self), (self.key, self.detail)
