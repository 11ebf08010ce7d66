"""Property test: random publish / delta_publish / sow_delete sequences applied by sow_redis
and by an in-memory reference model give the same SOW."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sow_redis.model.messages import merge
from sow_redis.publish.append import append, append_delete_all_partitions

KEYS = st.integers(0, 5)
VALUE = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b"]), st.none())
BODY = st.dictionaries(st.sampled_from(["x", "y", "z"]),
                       st.one_of(VALUE, st.dictionaries(st.sampled_from(["p", "q"]), VALUE, max_size=2)),
                       max_size=3)
OP = st.one_of(
    st.tuples(st.just("publish"), KEYS, BODY),
    st.tuples(st.just("delta_publish"), KEYS, BODY),
    st.tuples(st.just("sow_delete"), KEYS, st.just({})),
    st.tuples(st.just("delete_filter"), st.integers(-3, 3), st.just({})),
)


class Model:
    """Reference SOW: dict key → record, AMPS semantics."""

    def __init__(self):
        self.sow: dict[int, dict] = {}

    def apply(self, op, k, body):
        if op == "publish":
            self.sow[k] = {"id": k, **body}
        elif op == "delta_publish":
            self.sow[k] = merge(self.sow.get(k, {}), {"id": k, **body})
        elif op == "sow_delete":
            self.sow.pop(k, None)
        else:  # delete_filter: /x > k
            self.sow = {kk: v for kk, v in self.sow.items()
                        if not (isinstance(v.get("x"), int) and not isinstance(v.get("x"), bool)
                                and v["x"] > k)}


def run(sow, topic, ops):
    t = sow.topic(topic)
    model = Model()
    for op, k, body in ops:
        model.apply(op, k, body)
    # everything goes through the log in order, applied in as few batches as the worker likes
    last: dict[int, str] = {}
    pending = []

    def flush():
        if pending:
            last.update(append(sow.r, t, pending).last_ids)
            pending.clear()

    import orjson

    for op, k, body in ops:
        if op == "delete_filter":
            flush()
            last.update(append_delete_all_partitions(sow.r, t, {"filter": f"/x > {k}"}))
        else:
            pending.append((op, orjson.dumps({"id": k, **body}), None))
    flush()
    sow.handoff(t, last, True, 30)
    got = {r.obj()["id"]: r.obj() for r in sow.sow(topic)}
    return got, model.sow


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(OP, max_size=25))
def test_random_sequences_match_reference_model(sow, ops):
    topic = f"m{uuid.uuid4().hex[:10]}"
    sow.apply_config(f'[[topic]]\nname = "{topic}"\nkey = ["/id"]\npartitions = 3\n'
                     'hash_index = [["/x"]]\n')
    got, want = run(sow, topic, ops)
    assert got == want
    # the hash index agrees with a scan after any sequence
    for v in (-1, 0, 1, "a"):
        lit = f"'{v}'" if isinstance(v, str) else str(v)
        via_index = sorted(r.obj()["id"] for r in sow.sow(topic, f"/x = {lit}"))
        assert via_index == sorted(k for k, o in want.items() if o.get("x") == v
                                   and type(o.get("x")) is type(v))
