"""The error hierarchy. Every user-facing failure is a SpecprobeError with a message
(what is wrong) and a hint (what to do); `cli.main` prints it as one line, exit code 2."""

from __future__ import annotations


class SpecprobeError(Exception):
    """Base: a problem with the user's input, config, files or models (exit code 2)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message.rstrip(".")
        if self.hint:
            text += f" — {self.hint}"
        return text.replace("\n", " ")


class ConfigError(SpecprobeError):
    """A bad flag, config file or rules file."""


class InputError(SpecprobeError):
    """A bad prompts file, result file, or other input data."""


class ModelLoadError(SpecprobeError):
    """A model or drafter that cannot be found or loaded."""


class AlignmentError(SpecprobeError):
    """A target/drafter pair that cannot be scored at all (e.g. shapes that cannot be compared)."""


class OutputError(SpecprobeError):
    """An output path that cannot be written."""


class ServerError(SpecprobeError):
    """A serving engine's HTTP API answered with an error, or not at all."""
