"""Each result file's schema (reprocube.results): the writer refuses a result whose keys are not the
schema's, the reader refuses a file with a key or a version the schema does not know, and what is
written reads back. Real results are checked against their schemas where the commands write them (the
writer checks every time): these tests show the checks can fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprocube.errors import CheckpointError
from reprocube.results.bench_result import BENCH_RESULT
from reprocube.results.check_result import CHECK_RESULT
from reprocube.results.compare_result import COMPARE_RESULT, read_compare
from reprocube.results.reproduce_result import REPRODUCE_RESULT
from reprocube.results.schema import VERSION_KEY, ResultFile
from reprocube.results.study_result import STUDY_RESULT
from reprocube.results.verify_result import VERIFY_RESULT, read_verify

SCHEMAS = (VERIFY_RESULT, COMPARE_RESULT, REPRODUCE_RESULT, STUDY_RESULT, CHECK_RESULT, BENCH_RESULT)
DIGEST = "ab" * 32


def _verify_result() -> dict:
    return {
        "subject": {"checkpoint": "epoch-0002", "config_hash": DIGEST, "weights_digest": DIGEST},
        "framework": "pytorch",
        "passed": True,
        "mode": "linear",
        "jobs": 1,
        "launcher": "local",
        "tolerance": 0.0,
        "known_not_to_resume": None,
        "wall_s": 1.5,
        "checks": [{"name": "restart", "check": "restart", "passed": True, "summary": "identical", "detail": None}],
        "processes": [],
    }


def test_the_schemas_name_distinct_files_and_keys_once():
    assert len({s.name for s in SCHEMAS}) == len(SCHEMAS)
    for schema in SCHEMAS:
        every = schema.keys + schema.optional_keys
        assert len(every) == len(set(every)) and VERSION_KEY not in every, schema.name


def test_a_verify_result_round_trips_with_its_version(tmp_path):
    path = VERIFY_RESULT.write(tmp_path, _verify_result(), "# verify\n")
    assert json.loads(path.read_text())[VERSION_KEY] == VERIFY_RESULT.version
    assert (tmp_path / "verify.md").read_text() == "# verify\n"
    back = read_verify(path)
    assert back["subject"]["checkpoint"] == "epoch-0002" and back["checks"][0]["passed"] is True


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.name)
def test_the_writer_refuses_a_result_that_is_not_its_schema(schema, tmp_path):
    complete = {key: None for key in schema.keys}
    with pytest.raises(ValueError, match="not in the schema"):
        schema.write(tmp_path, {**complete, "surprise": 1})
    with pytest.raises(ValueError, match="missing"):
        schema.write(tmp_path, {k: v for k, v in complete.items() if k != schema.keys[0]})
    assert not any(tmp_path.iterdir()), "nothing is written for a refused result"


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.name)
def test_the_reader_refuses_an_unknown_key_and_another_version(schema, tmp_path):
    path = tmp_path / schema.name
    path.write_text(json.dumps({schema.keys[0]: None, "injected": 1}))
    with pytest.raises(CheckpointError, match="'injected' is not a key of"):
        schema.read(path)
    path.write_text(json.dumps({VERSION_KEY: schema.version + 1}))
    with pytest.raises(CheckpointError, match=f"{VERSION_KEY} {schema.version + 1} is not {schema.version}"):
        schema.read(path)
    path.write_text(json.dumps({schema.keys[0]: None}))  # a file written before results had a version
    assert schema.read(path).value == {schema.keys[0]: None}


def test_a_compare_result_is_read_strictly(tmp_path):
    subject = {"checkpoint": "epoch-0001", "config_hash": None, "weights_digest": DIGEST}
    inputs = {"checkpoints": {"epoch-0001": DIGEST}, "env.json": DIGEST, "metrics.jsonl": None, "receipt.json": None}
    result = {key: None for key in COMPARE_RESULT.keys} | {
        "subject": {"a": subject, "b": None},
        "inputs": {"a": inputs, "b": inputs},
        "run_a": "a",
        "run_b": "b",
        "compared_checkpoints": ["epoch-0001"],
        "identical": True,
        "passed": True,
        "tolerance": 0.0,
    }
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(result))
    assert read_compare(path)["subject"] == {"a": subject, "b": None}
    path.write_text(json.dumps({**result, "subject": {"a": {**subject, "weights_digest": "x"}, "b": None}}))
    with pytest.raises(CheckpointError, match="weights_digest must be a sha256"):
        read_compare(path)
    path.write_text(json.dumps({**result, "identical": "yes"}))
    with pytest.raises(CheckpointError, match="identical must be true or false"):
        read_compare(path)
    assert read_compare(_rewritten(path, result))["inputs"]["a"] == inputs
    unbound = {**result, "inputs": {"a": {**inputs, "checkpoints": {"epoch-0001": "not a digest"}}, "b": inputs}}
    path.write_text(json.dumps(unbound))
    with pytest.raises(CheckpointError, match="inputs: a: checkpoints: epoch-0001 must be a sha256"):
        read_compare(path)


def _rewritten(path, value) -> object:
    path.write_text(json.dumps(value))
    return path


def test_a_result_file_is_not_read_through_a_symbolic_link(tmp_path):
    real = VERIFY_RESULT.write(tmp_path, _verify_result())
    link = tmp_path / "linked" / "verify.json"
    link.parent.mkdir()
    link.symlink_to(real)
    with pytest.raises(CheckpointError):
        read_verify(link)


def test_a_new_schema_is_a_few_lines():
    schema = ResultFile("x.json", version=3, keys=("a",), optional_keys=("b",))
    assert schema.markdown_name == "x.md" and schema.check({"a": 1, "b": 2}, "x").value == {"a": 1, "b": 2}


# A reproduce.json as reprocube wrote it at schema version 2 (on the H100 host, 2026-11-25): before
# first_divergence.weights_identical and match.recipe were written every time.
REPRODUCE_V2 = Path(__file__).with_name("fixtures") / "reproduce-v2.json"


def test_an_older_reproduce_result_is_upgraded_in_one_place_and_read(tmp_path):
    from reprocube.results.reproduce_result import read_reproduce

    assert json.loads(REPRODUCE_V2.read_text())[VERSION_KEY] == 2
    result = read_reproduce(REPRODUCE_V2)
    assert result["first_divergence"]["weights_identical"] is False  # what its absence meant
    assert result["match"]["recipe"] is None and result["verdict"] == "differs"
    # The same object claiming the current version is not upgraded: the missing key is named.
    current = {**json.loads(REPRODUCE_V2.read_text()), VERSION_KEY: REPRODUCE_RESULT.version}
    (tmp_path / "reproduce.json").write_text(json.dumps(current))
    with pytest.raises(CheckpointError, match="weights_identical"):
        read_reproduce(tmp_path / "reproduce.json")


def test_an_upgrade_adds_only_what_is_missing_and_never_a_version_it_does_not_know():
    schema = ResultFile("x.json", version=3, keys=("a", "b"), upgrades=((1, lambda v: v), (2, lambda v: {**v, "b": 0})))
    assert schema.check({VERSION_KEY: 2, "a": 1}, "x").value == {VERSION_KEY: 3, "a": 1, "b": 0}
    assert schema.check({VERSION_KEY: 1, "a": 1}, "x").value == {VERSION_KEY: 3, "a": 1, "b": 0}
    for odd in (True, 2.0, "2", 4):  # True == 1 and 2.0 == 2 in a dict lookup: never an upgrade
        with pytest.raises(CheckpointError, match="is not 3"):
            schema.check({VERSION_KEY: odd, "a": 1}, "x")


# Every result file's contract as last recorded: its version, its keys and, where it has them, its verdicts.
# A change to a contract without a version bump fails here; a bumped one asks for the record to be made
# again (REPROCUBE_RECORD_SCHEMAS=1), so that the change is seen in review.
GOLDEN_SCHEMAS = Path(__file__).parent / "golden_result_schemas.json"


def _contracts() -> dict:
    from reprocube.results import check_result, reproduce_result, script_reproduce_result
    from reprocube.results.script_reproduce_result import SCRIPT_REPRODUCE_RESULT

    verdicts = {
        CHECK_RESULT.name: dict(check_result.VERDICTS),
        REPRODUCE_RESULT.name: list(reproduce_result.VERDICTS),
        SCRIPT_REPRODUCE_RESULT.name: dict(script_reproduce_result.VERDICTS),
    }
    return {
        schema.name: {
            "version": schema.version,
            "keys": list(schema.keys),
            "optional_keys": list(schema.optional_keys),
            "verdicts": verdicts.get(schema.name),
        }
        for schema in (*SCHEMAS, SCRIPT_REPRODUCE_RESULT)
    }


def contract_change(now: dict, recorded: dict) -> str | None:
    """What is wrong with the contracts now against the record: None where they are the same."""
    for name, contract in now.items():
        before = recorded.get(name)
        if before == contract:
            continue
        if before is not None and contract["version"] == before["version"]:
            return (
                f"{name}: its keys or verdicts changed and its version ({contract['version']}) did not: bump it, "
                "with an upgrade from the last one (results/schema.py)"
            )
        return f"{name}: version {contract['version']} is new: record it (REPROCUBE_RECORD_SCHEMAS=1)"
    if set(recorded) != set(now):
        return "a result file was added or removed: record it (REPROCUBE_RECORD_SCHEMAS=1)"
    return None


def test_no_result_file_changes_its_keys_or_verdicts_without_a_version_bump():
    import os

    now = _contracts()
    if os.environ.get("REPROCUBE_RECORD_SCHEMAS") == "1":
        GOLDEN_SCHEMAS.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    assert contract_change(now, json.loads(GOLDEN_SCHEMAS.read_text())) is None


def test_the_contract_record_sees_a_key_or_a_verdict_added_without_a_bump():
    recorded = _contracts()
    added_key = json.loads(json.dumps(recorded))
    added_key["check.json"]["keys"].append("new_key")
    assert "did not: bump it" in contract_change(added_key, recorded)
    added_verdict = json.loads(json.dumps(recorded))
    added_verdict["check.json"]["verdicts"]["new-verdict"] = 9
    assert "did not: bump it" in contract_change(added_verdict, recorded)
    bumped = json.loads(json.dumps(added_key))
    bumped["check.json"]["version"] += 1
    assert "is new: record it" in contract_change(bumped, recorded)


def test_a_check_json_of_version_2_is_upgraded_to_3(tmp_path):
    """check.json 2 had no rule, and named its moved-weights restarts poisoned-N, stage poison."""
    from reprocube.results.check_result import read_check_page

    version_2 = {
        VERSION_KEY: 2,
        "command": ["python", "train.py"],
        "verdict": "not-proven",
        "summary": "not-proven: ...",
        "stage": "poison",
        "outputs": {"paths": ["final.npy"], "ignore": []},
        "stop_seed": 1,
        "stops": "",
        "signal": "TERM",
        "runs": [{"name": "poisoned-1", "attempts": []}],
        "comparisons": {"repeat": [], "poisoned-1": {}},
        "not_checked": [],
        "probe": None,
        "environment": {},
        "wall_s": 1.0,
    }
    path = tmp_path / "check.json"
    path.write_text(json.dumps(version_2))
    fields = CHECK_RESULT.read(path)
    assert fields.value["rule"] is None and fields.value["stage"] == "moved-weights"
    assert [run["name"] for run in fields.value["runs"]] == ["moved-1"] and "moved-1" in fields.value["comparisons"]
    assert read_check_page(path)["runs"][0]["name"] == "moved-1"
