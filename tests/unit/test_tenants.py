"""The tenants file: what it accepts, every refusal with its line and reason, key lookup."""

from __future__ import annotations

import hashlib
import textwrap

import pytest
from triton_embed.priority import Priority
from triton_embed_server.gateway.tenants import (
    KEY_TENANT,
    OPEN_TENANT,
    TenantsFileError,
    key_tenants,
    load_tenants,
    open_tenants,
    parse_tenants,
)

SEARCH_KEY = "search-key-0123456789"
INDEXER_KEY = "indexer-key-0123456789"


def digest(key: str) -> str:
    """What ``printf %s KEY | sha256sum`` prints (its first field)."""
    return hashlib.sha256(key.encode()).hexdigest()


GOOD = textwrap.dedent(
    f"""\
    usd_per_million_tokens: 0.004
    tenants:
      - name: search
        keys_sha256: [{digest(SEARCH_KEY)}]
        priority: interactive
        models: [embed]
        tokens_per_minute: 600000
        burst: 100000
        max_concurrency: 16
      - name: indexer
        keys_sha256:
          - {digest(INDEXER_KEY).upper()}
        priority: batch
        weight: 3
    """
)


def test_a_full_file_is_read_with_its_defaults():
    tenants = parse_tenants(GOOD)
    search, indexer = tenants.tenants["search"], tenants.tenants["indexer"]
    assert search.priority is Priority.INTERACTIVE and search.priority.level == 1
    assert search.models == frozenset({"embed"})
    assert (search.tokens_per_minute, search.burst, search.max_concurrency) == (600000, 100000, 16)
    assert search.weight == 1.0
    assert indexer.priority is Priority.BATCH and indexer.priority.level == 2
    assert (indexer.models, indexer.tokens_per_minute, indexer.burst) == (None, None, None)
    assert indexer.weight == 3.0
    assert tenants.usd_per_million_tokens == 0.004


def test_a_key_selects_its_tenant_by_digest_upper_case_digests_too():
    tenants = parse_tenants(GOOD)
    assert tenants.identify(SEARCH_KEY).name == "search"
    assert tenants.identify(INDEXER_KEY).name == "indexer"
    assert tenants.identify("another-key") is None
    assert tenants.identify("") is None and tenants.identify(None) is None
    assert tenants.identify(digest(SEARCH_KEY)) is None  # the digest is not the key


def test_the_burst_defaults_to_the_rate():
    text = GOOD.replace("    burst: 100000\n", "")
    assert parse_tenants(text).tenants["search"].burst == 600000


def test_a_digest_of_digits_only_stays_a_string():
    text = GOOD.replace(digest(INDEXER_KEY).upper(), "1" * 64)
    assert parse_tenants(text).tenants["indexer"].name == "indexer"


def test_the_api_key_is_one_tenant_and_no_key_an_open_gateway():
    one = key_tenants("k" * 20)
    assert one.identify("k" * 20).name == KEY_TENANT
    assert one.identify("x" * 20) is None
    assert one.tenants[KEY_TENANT].priority is Priority.INTERACTIVE
    assert open_tenants().identify(None).name == OPEN_TENANT


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("edit", "needle", "where", "reason"),
    [
        (("priority: batch", "priority: bulk"), "priority: bulk", "tenants[1].priority",
         "Input should be 'interactive' or 'batch'"),
        (("max_concurrency: 16", "max_concurrency: 0"), "max_concurrency: 0",
         "tenants[0].max_concurrency", "Input should be greater than 0"),
        (("tokens_per_minute: 600000", "tokens_per_minute: lots"), "tokens_per_minute: lots",
         "tenants[0].tokens_per_minute", "Input should be a valid integer"),
        (("weight: 3", "weight: -1"), "weight: -1", "tenants[1].weight",
         "Input should be greater than 0"),
        (("weight: 3", "colour: red"), "colour: red", "tenants[1].colour",
         "Extra inputs are not permitted"),
        (("name: indexer", "name: Indexer!"), "name: Indexer!", "tenants[1].name",
         "String should match pattern"),
        (("usd_per_million_tokens: 0.004", "usd_per_million_tokens: -1"),
         "usd_per_million_tokens", "usd_per_million_tokens", "greater than or equal to 0"),
    ],
)  # fmt: skip
def test_a_bad_field_is_refused_with_its_line_field_and_reason(edit, needle, where, reason):
    text = GOOD.replace(*edit)
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(text, "tenants.yaml")
    message = str(caught.value)
    assert message.startswith(f"tenants.yaml, line {_line(text, needle)}, {where}: "), message
    assert reason in message


def test_a_bad_digest_says_how_to_make_one():
    text = GOOD.replace(digest(SEARCH_KEY), "not-a-digest")
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(text, "t.yaml")
    assert str(caught.value) == (
        f"t.yaml, line {_line(text, 'not-a-digest')}, tenants[0].keys_sha256: item 0 is not a "
        "SHA-256 hex digest (64 hex digits); make one with: printf %s KEY | sha256sum"
    )


def test_a_missing_field_names_its_tenants_line():
    text = GOOD.replace("    priority: batch\n", "")
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(text, "t.yaml")
    assert str(caught.value) == (
        f"t.yaml, line {_line(text, 'name: indexer')}, tenants[1].priority: Field required"
    )


def test_a_burst_without_a_rate_is_refused():
    text = GOOD.replace("    tokens_per_minute: 600000\n", "")
    with pytest.raises(TenantsFileError, match=r"tenants\[0\]: burst needs tokens_per_minute"):
        parse_tenants(text)


def test_a_name_or_a_key_given_twice_is_refused_at_the_second():
    twice = GOOD.replace("name: indexer", "name: search")
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(twice, "t.yaml")
    line = _line(twice, "name: search") + 7  # the second "name: search"
    assert str(caught.value).startswith(f"t.yaml, line {line}, tenants[1].name: 'search' is")
    shared = GOOD.replace(digest(INDEXER_KEY).upper(), digest(SEARCH_KEY))
    with pytest.raises(TenantsFileError, match="is also a key of tenant 'search'"):
        parse_tenants(shared)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "t.yaml: the file is empty; it needs a 'tenants' list"),
        ("tenants: []\n", "t.yaml, line 1, tenants: List should have at least 1 item"),
        ("tenants: [ {name: a\n", "t.yaml, line 2: not valid YAML: expected ',' or '}'"),
        ("- a\n- b\n", "t.yaml, line 1, the file: Input should be a valid dictionary"),
    ],
)
def test_a_file_that_is_not_a_tenants_file_is_refused(text, expected):
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(text, "t.yaml")
    assert str(caught.value).startswith(expected), str(caught.value)


def test_a_missing_file_names_itself(tmp_path):
    with pytest.raises(TenantsFileError, match="cannot be read"):
        load_tenants(tmp_path / "nope.yaml")


def test_no_key_appears_in_any_message():
    text = GOOD.replace("priority: batch", "priority: nope")
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(text)
    assert SEARCH_KEY not in str(caught.value) and INDEXER_KEY not in str(caught.value)


def test_the_example_file_of_the_docs_is_valid():
    from triton_embed_server.run.launcher import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "tenants.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    tenants = parse_tenants(example, "docs/tenants.md")
    assert set(tenants.tenants) == {"search", "indexer", "nightly"}
    assert tenants.identify("search-key-example").name == "search"
    assert tenants.identify("indexer-key-example").name == "indexer"
    assert tenants.identify("nightly-key-example").name == "nightly"


def test_a_field_given_twice_is_refused_with_its_second_line():
    text = (
        "tenants:\n"
        "  - name: alpha\n"
        "    keys_sha256: ['" + "a" * 64 + "']\n"
        "    models: [colbert]\n"
        "    models: [embed]\n"
    )
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants(text, "t.yaml")
    assert str(caught.value) == (
        "t.yaml, line 5: the field 'models' is given twice in one mapping; keep one"
    )
