"""Exceptions of fsdp_mlir: one class per error kind of the runtime
(docs/Errors.md). Bad arguments (the runtime's "invalid argument") raise
ValueError."""

__all__ = ["CheckpointError", "NotFound", "Corrupt", "Incompatible", "IOError_", "Busy"]


class CheckpointError(Exception):
    """A save, load, check or verify failed. `kind` is the runtime's name of
    the error kind ("corrupt", ...), `exit_code` the code fsdp-ckpt exits
    with for it."""

    kind = "failed"
    exit_code = 1


class NotFound(CheckpointError):
    """No such file, directory or committed checkpoint."""

    kind = "not found"
    exit_code = 3


class Corrupt(CheckpointError):
    """A file is damaged or malformed (checksum, truncation, parse error)."""

    kind = "corrupt"
    exit_code = 4


class Incompatible(CheckpointError):
    """Well-formed, but not what the plan expects (key, shape, dtype, coverage)."""

    kind = "incompatible"
    exit_code = 5


class IOError_(CheckpointError, OSError):
    """The operating system refused; `errno` holds its error number."""

    kind = "I/O error"
    exit_code = 6

    def __init__(self, message, errno=0):
        OSError.__init__(self, message)
        self.errno = errno or None
        if errno:
            import os

            self.strerror = os.strerror(errno)

    def __str__(self):
        return self.args[0] if self.args else ""


class Busy(CheckpointError):
    """Another save holds the target."""

    kind = "busy"
    exit_code = 7


# The runtime's ErrorKind values (include/fsdp/Support/Result.h).
_INTERNAL, _INVALID_ARGUMENT, _NOT_FOUND, _CORRUPT, _INCOMPATIBLE, _IO, _BUSY = range(7)
_CLASSES = {
    _NOT_FOUND: NotFound,
    _CORRUPT: Corrupt,
    _INCOMPATIBLE: Incompatible,
    _BUSY: Busy,
}


def make_error(kind, kind_name, errnum, message):
    """The exception for a runtime error (called by the extension)."""
    # The runtime's messages name fsdp-ckpt's options; ours are arguments.
    message = message.replace("pass --overwrite", "pass overwrite=True").replace(
        "--overwrite replaces only", "overwrite=True replaces only")
    if kind == _INVALID_ARGUMENT:
        return ValueError(message)
    if kind == _IO:
        return IOError_(message, errnum)
    return _CLASSES.get(kind, CheckpointError)(message)
