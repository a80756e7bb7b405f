"""PLACEHOLDER created by the formats helper because ferrum_ffi/status.py did not
exist yet; the lead owns this module and will replace it."""


class ArgumentError(ValueError):
    pass


class ArgumentTypeError(TypeError):
    pass
