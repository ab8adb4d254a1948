"""The one exception type for bad input: a message a user can act on, naming the key, file or column."""


class KilnError(ValueError):
    """Expected failure caused by input (config, data, files); stage scripts print it without a traceback."""
