"""config import-amps translates AMPS View and ConflatedTopic (issue 26: Projection,
Grouping, UnderlyingTopic, Interval, Filter) into [[view]] and [[conflated_topic]] tables."""

from __future__ import annotations

from sow_redis.config import parse_topics
from sow_redis.ops.amps_import import import_amps, to_toml

XML = """<AMPSConfig><SOW>
  <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
  <View>
    <Name>orders_by_sym</Name>
    <UnderlyingTopic>orders</UnderlyingTopic>
    <MessageType>json</MessageType>
    <Projection>
      <Field>/sym</Field>
      <Field>COUNT(/id) AS /orders</Field>
      <Field>SUM(/qty) AS /qty</Field>
    </Projection>
    <Grouping><Field>/sym</Field></Grouping>
    <Filter>/qty &gt; 0</Filter>
  </View>
  <View>
    <Name>notional</Name>
    <UnderlyingTopic>orders</UnderlyingTopic>
    <Projection><Field>/sym</Field><Field>SUM(/px * /qty) AS /total</Field></Projection>
    <Grouping><Field>/sym</Field></Grouping>
  </View>
  <View>
    <Name>joined</Name>
    <UnderlyingTopic><Join>[orders]./id = [fills]./id</Join></UnderlyingTopic>
  </View>
  <ConflatedTopic>
    <Name>orders_1s</Name>
    <UnderlyingTopic>orders</UnderlyingTopic>
    <MessageType>json</MessageType>
    <Interval>1s</Interval>
    <Filter>/sym = 'MSFT'</Filter>
  </ConflatedTopic>
  <Queue><Name>work</Name></Queue>
</SOW></AMPSConfig>"""


def test_views_and_conflated_topics_are_translated_or_skipped_with_a_reason():
    imported = import_amps(XML)
    assert [t["name"] for t in imported.topics] == ["orders"]
    assert imported.derived == [
        ("view", {"name": "orders_by_sym", "underlying": "orders",
                  "projection": ["/sym", "COUNT(/id) AS /orders", "SUM(/qty) AS /qty"],
                  "grouping": ["/sym"], "filter": "/qty > 0"}),
        ("conflated_topic", {"name": "orders_1s", "underlying": "orders", "interval": "1s",
                             "filter": "/sym = 'MSFT'"}),
    ]
    skipped = "\n".join(imported.skipped)
    assert "SOW/View[notional]: projection item 'SUM(/px * /qty) AS /total'" in skipped
    assert "SOW/View[joined]: a join of topics is not translated: skipped" in skipped
    assert "SOW/Queue[work]: not translated" in skipped
    topics = parse_topics(to_toml(imported))
    assert [(t.name, t.kind) for t in topics] == [
        ("orders", "topic"), ("orders_by_sym", "view"), ("orders_1s", "conflated_topic")]
