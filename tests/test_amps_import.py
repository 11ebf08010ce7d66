"""``sow-redis config import-amps`` (issue 13 item 5): every AMPS SOW configuration example
in the seeds translates into TOML that loads, and each element not translated is listed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import SHARED

from sow_redis.amps_config import import_amps, to_toml
from sow_redis.config import parse_topics
from sow_redis.errors import ConfigError

SEEDS = sorted((SHARED / "seeds").glob("*.txt"))


def _examples():
    out = []
    for seed in SEEDS:
        text = seed.read_text(errors="replace")
        for i, block in enumerate(re.findall(r"(?:<Modules>.*?</Modules>\s*)?<SOW>.*?</SOW>",
                                             text, re.S)):
            out.append(pytest.param(block, id=f"{seed.name[:3]}-{i}"))
    return out


EXAMPLES = _examples()


def test_the_seeds_hold_sow_configuration_examples():
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize("xml", EXAMPLES)
def test_every_seed_example_translates_into_toml_that_loads(xml):
    imported = import_amps(xml)
    topics = parse_topics(to_toml(imported)) if imported.topics else []
    print([t.name for t in topics], imported.skipped)
    assert len(topics) + sum("topic skipped" in s for s in imported.skipped) == \
        xml.count("<Topic>")
    assert len(topics) >= 1 or imported.skipped


def test_each_element_is_translated_as_documented():
    xml = """
    <AMPSConfig><Modules><Module><Name>chain</Name>
      <Library>libamps_id_chaining_key_generator.so</Library></Module></Modules>
    <SOW>
      <Topic><Name>ORDERS</Name><FileName>sow/%n.sow</FileName><Key>/invoice</Key>
        <Key>/customerId</Key><KeyDomain>shared</KeyDomain><MessageType>json</MessageType>
        <Expiration>1h</Expiration><SlabSize>1MB</SlabSize>
        <HashIndex><Key>/region</Key></HashIndex><HashIndex><Key>/a</Key><Key>/b</Key></HashIndex>
      </Topic>
      <Topic><Name>Chains</Name><MessageType>fix</MessageType>
        <KeyGenerator><Module>chain</Module><Options><Key>/11</Key><Key>/41</Key>
          <Validation>true</Validation><FileName>x.chain</FileName></Options></KeyGenerator>
      </Topic>
      <Topic><Name>ALERTS</Name><Key>/alert/id</Key><MessageType>xml</MessageType></Topic>
      <Topic><Name>Custom</Name><KeyGenerator><Module>mine</Module></KeyGenerator></Topic>
    </SOW></AMPSConfig>"""
    imported = import_amps(xml)
    orders, chains = parse_topics(to_toml(imported))
    assert orders.key == ("/invoice", "/customerId") and orders.key_domain == "shared"
    assert orders.expiration == "1h" and orders.hash_index == (("/region",), ("/a", "/b"))
    assert chains.chaining and chains.chain_primary == "/11"
    assert chains.chain_secondary == ("/41",) and chains.chain_validation
    assert chains.message_type == "fix" and chains.partitions == 1
    skipped = "\n".join(imported.skipped)
    print(skipped)
    for needle in ("SOW/Topic[ORDERS]/FileName", "SOW/Topic[ORDERS]/SlabSize",
                   "SOW/Topic[Chains]/KeyGenerator/Options/FileName",
                   "SOW/Topic[ALERTS]: MessageType 'xml' is not supported",
                   "SOW/Topic[Custom]: KeyGenerator module 'mine'"):
        assert needle in skipped


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no <SOW> section"):
        import_amps("<AMPSConfig/>")
    with pytest.raises(ConfigError, match="not well-formed"):
        import_amps("<SOW><Topic><Name>x</Topic></SOW>")
    with pytest.raises(ConfigError, match="DOCTYPE or ENTITY"):
        import_amps('<!DOCTYPE x [<!ENTITY a "b">]><SOW></SOW>')
    f = tmp_path / "bad.xml"
    f.write_text("<SOW><Topic>")
    out = subprocess.run([sys.executable, "-m", "sow_redis.cli", "config", "import-amps",
                          str(f)], capture_output=True)
    assert out.returncode == 1 and out.stderr.decode().count("\n") == 1


def test_cli_writes_the_toml_and_lists_what_it_skipped(tmp_path):
    seed = next(s for s in SEEDS if s.name.startswith("004"))
    block = re.findall(r"<SOW>.*?</SOW>", seed.read_text(), re.S)[-1]
    src = tmp_path / "amps.xml"
    src.write_text(block)
    out_toml = tmp_path / "sow.toml"
    out = subprocess.run([sys.executable, "-m", "sow_redis.cli", "config", "import-amps",
                          str(src), "-o", str(out_toml)], capture_output=True)
    assert out.returncode == 0, out.stderr
    names = [t.name for t in parse_topics(out_toml.read_text())]
    print(names, out.stderr.decode())
    assert "ORDERS" in names and b"FileName: not translated" in out.stderr
