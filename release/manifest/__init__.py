"""A release manifest (``manifests/*.toml``): its schema and its loader.

``load_manifest`` is the only way in: it parses the TOML, validates it against the frozen models,
checks the cross-references between sections, and turns every problem into a ``ManifestError``
whose lines read ``<file>: <dotted.key>: expected <what>; got <value>``.

* ``fields``: the field checks, the constants they check against, the strict base model;
* ``models``: one model per table;
* ``load``: reading, cross-references and error lines.

May import (``MAY_IMPORT`` in tests/test_architecture.py): ``release.errors``, ``release.util``
and ``release.catalogue`` (the gates a manifest may name); nothing that runs a step.
"""

from release.manifest.fields import index_root
from release.manifest.load import load_manifest
from release.manifest.models import (
    SIGNING_KEY_ATTESTER,
    ChannelSpec,
    CiRelease,
    CiSettings,
    Manifest,
    PinnedKeys,
    Shim,
    SignSpec,
    TufKeys,
)
from release.util.limits import NetworkLimits

__all__ = [
    "SIGNING_KEY_ATTESTER",
    "ChannelSpec",
    "CiRelease",
    "CiSettings",
    "Manifest",
    "NetworkLimits",
    "PinnedKeys",
    "Shim",
    "SignSpec",
    "TufKeys",
    "index_root",
    "load_manifest",
]
