"""Exceptions the faces turn into messages (CLI exit 2, GUI dialog) instead of tracebacks."""

from __future__ import annotations


class RamError(Exception):
    """Base class for every error the user can act on."""


class InputError(RamError):
    """Bad input: a missing path, corrupt file, mismatched tensors, unusable output folder...

    The message names the file, tensor or repository and says what to do.
    """


class Cancelled(RamError):
    """The user cancelled the operation; partial output has been removed."""
