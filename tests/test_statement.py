"""release/statement.py's typed reading of a release's provenance: the attestations it names
(`byproducts`), the gates it says were required and its version, each from the signed document,
and a malformed entry refused naming its place."""

from __future__ import annotations

from typing import Any

import pytest

from release.errors import SigningError
from release.statement import STATEMENT_TYPE, Byproduct, Statement

DIGEST = "ab" * 32


def provenance(byproducts: Any = None, **parameters: Any) -> Statement:
    run = {} if byproducts is None else {"byproducts": byproducts}
    return Statement({
        "_type": STATEMENT_TYPE, "subject": [],
        "predicate": {"buildDefinition": {"externalParameters": parameters}, "runDetails": run},
    })  # fmt: skip


def test_byproducts_are_typed_with_their_annotations() -> None:
    entry = {"name": "payload.intoto.json", "digest": {"sha256": DIGEST},
             "annotations": {"gate": "payload", "keyid": "k"}}  # fmt: skip
    (byproduct,) = provenance([entry]).byproducts
    assert byproduct == Byproduct("payload.intoto.json", DIGEST, {"gate": "payload", "keyid": "k"})
    assert byproduct.gate == "payload"
    assert Byproduct("x", DIGEST, {"gate": 3}).gate is None  # not a gate's name


def test_a_statement_without_byproducts_names_none() -> None:
    assert provenance().byproducts == ()
    assert Statement({"_type": STATEMENT_TYPE, "subject": []}).byproducts == ()


@pytest.mark.parametrize(
    "entry",
    [{"digest": {"sha256": DIGEST}}, {"name": "a.intoto.json"},
     {"name": "a.intoto.json", "digest": {"sha256": 7}}, {"name": 1, "digest": {"sha256": DIGEST}},
     {"name": "a.intoto.json", "digest": {"sha256": DIGEST}, "annotations": []}, "a.intoto.json",
     None],
    ids=repr,
)  # fmt: skip
def test_a_malformed_byproduct_is_refused_naming_its_index(entry: Any) -> None:
    good = {"name": "good.intoto.json", "digest": {"sha256": DIGEST}}
    with pytest.raises(SigningError) as refused:
        provenance([good, entry]).byproducts  # noqa: B018 (the property reads and checks)
    assert str(refused.value) == (
        "predicate.runDetails.byproducts[1]: expected an attestation's name and sha256 digest; "
        f"got {entry!r}"
    )


def test_byproducts_that_are_not_a_list_are_refused() -> None:
    with pytest.raises(SigningError, match=r"^predicate.runDetails.byproducts: expected a list"):
        provenance({"name": "a"}).byproducts  # noqa: B018


def test_required_gates_and_version_read_the_external_parameters() -> None:
    statement = provenance([], gates=["payload", "parity", 3], version="0.1.0")
    assert statement.required_gates == ("payload", "parity")  # a non-name is no gate
    assert statement.version == "0.1.0"
    assert provenance().required_gates == ()
    assert provenance().version is None
    assert Statement({"predicate": "not a mapping"}).version is None
