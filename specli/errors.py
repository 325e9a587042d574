"""Domain errors. Library code raises these; ``specli.cli`` translates them to exit codes once."""

from __future__ import annotations


class SpecliError(Exception):
    """Base class of every error specli reports to a user."""

    exit_code = 1


class ModelLoadError(SpecliError):
    """A model could not be found, verified, read or converted. The message names the file."""

    exit_code = 3


class AudioError(SpecliError):
    """An audio file could not be decoded. The message names the file and the reason. Batch commands report
    it per input and go on; one that reaches ``specli.cli`` exits 1 (an input failed)."""

    exit_code = 1


class PresetError(SpecliError):
    """A preset is unknown or has invalid or unknown keys."""

    exit_code = 2


class UsageError(SpecliError):
    """An option value is invalid or does not fit the model (an unknown language, translate with an
    English-only model); reported before any input is processed."""

    exit_code = 2
