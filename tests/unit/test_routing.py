"""Dynamic route values and the catalog's case rules (transform/routing.py), without a broker."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tidewater.config.parse import parse_pipeline
from tidewater.transform.routing import Router


def _router(case_sensitive: bool) -> Router:
    return Router(parse_pipeline({
        "name": "relroute2", "topics": ["t"], "kafka": {"bootstrap_servers": "h:1"}, "table": {"identifier": ""},
        "catalog": {"case_sensitive": case_sensitive},
        "routing": {"namespace": "ev", "field": "k", "dynamic": True, "table_template": "ev_{value}"},
    }))


@pytest.mark.parametrize("value", ["RELROUTE2_CHECKPOINTS", "Relroute2_Dead_Letters", "relroute2_checkpoints", "relroute2_ledger"])
def test_a_case_variant_of_a_protected_table_is_refused_whatever_the_catalog(value):
    """With the template `{value}`, a value naming the checkpoint, dead-letter or ledger table in any case is refused,
    on a case-folding catalog and on a case-sensitive one alike (the names only differ by case)."""
    for case_sensitive in (False, True):
        router = Router(parse_pipeline({
            "name": "relroute2", "topics": ["t"], "kafka": {"bootstrap_servers": "h:1"}, "table": {"identifier": ""},
            "catalog": {"case_sensitive": case_sensitive}, "routing": {"namespace": "ev", "field": "k", "dynamic": True},
        }))
        refused = router.refusal(value)
        if case_sensitive and value != value.lower():
            assert refused is None, "a case-sensitive catalog keeps them apart"
        else:
            assert refused is not None and "own checkpoint, dead-letter or ledger table" in refused


def test_values_that_differ_by_case_name_one_table_unless_the_catalog_is_case_sensitive():
    """`VT`, `vt` and `Vt` route to `ev.ev_vt` together (one mask holding all three rows) on the default,
    case-folding rule; with `catalog.case_sensitive` they name three tables."""
    data = pa.table({"k": ["VT", "vt", "Vt", "other"]})
    folded = _router(False).route("t", data)
    assert sorted(folded.masks) == ["ev.ev_other", "ev.ev_vt"]
    assert folded.masks["ev.ev_vt"].to_pylist() == [True, True, True, False]
    kept = _router(True).route("t", data)
    assert sorted(kept.masks) == ["ev.ev_VT", "ev.ev_Vt", "ev.ev_other", "ev.ev_vt"]
