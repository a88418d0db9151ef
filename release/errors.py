"""Error types of the pipeline. Every message names the file, key or argument at fault."""


class ReleaseError(Exception):
    """A step cannot go on; the message says what was expected and where."""


class ManifestError(ReleaseError):
    """The manifest is malformed: the message names the file, the key and what was expected."""


class WriteError(ReleaseError):
    """A file could not be written (no space left, no permission): the message names the file and
    the operating system's reason; nothing of it is left half-written."""


class BuildError(ReleaseError):
    """A wheel could not be built, or the built wheel breaks a build rule."""


class GateError(ReleaseError):
    """A gate could not judge its inputs (distinct from a gate that ran and failed)."""


class SigningError(ReleaseError):
    """A key could not be loaded or used, or a signature does not verify."""


class PackageIndexError(ReleaseError):
    """The package index could not be started or reached."""


class PublishError(ReleaseError):
    """Publishing was refused; nothing that was already published has changed."""


class VerifyError(ReleaseError):
    """What the index serves does not match what was signed, or does not install and import."""
