import json
import os

import pytest

from pipeline.core.io import InputError, atomic_path, atomic_write_json, load_spec, read_jsonl


def test_atomic_path_replaces_only_on_success(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as temporary:
        temporary.write_text("half written")
        raise RuntimeError("killed mid-way")
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"], "the temporary file must be removed"


def test_atomic_path_works_for_directories(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "old.bin").write_text("old")
    with atomic_path(target) as temporary:
        temporary.mkdir()
        (temporary / "new.bin").write_text("new")
    assert sorted(os.listdir(target)) == ["new.bin"]


def test_read_jsonl_names_file_and_line_of_a_corrupt_row(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text('{"id": 1}\n{"id": 2\n{"id": 3}\n')
    with pytest.raises(InputError, match=r"bench\.jsonl:2: not valid JSON"):
        read_jsonl(path)


def test_read_jsonl_tolerates_only_a_torn_tail_when_asked(tmp_path):
    path = tmp_path / "partial.jsonl"
    path.write_text('{"id": 1}\n{"id": 2}\n{"id": ')
    assert [row["id"] for row in read_jsonl(path, tolerate_torn_tail=True)] == [1, 2]
    with pytest.raises(InputError, match=":3:"):
        read_jsonl(path)


def test_read_jsonl_refuses_non_objects(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(InputError, match=r"rows\.jsonl:1: expected a JSON object, got list"):
        read_jsonl(path)


def test_load_spec_reads_inline_json_and_yaml_files(tmp_path):
    assert load_spec('{"lr": 1e-6}') == {"lr": 1e-6}
    path = tmp_path / "spec.yaml"
    path.write_text("credit: grail\ngrail_std: 0.5\n")
    assert load_spec(str(path)) == {"credit": "grail", "grail_std": 0.5}
    with pytest.raises(InputError, match="not valid JSON"):
        load_spec("{lr: }")
    with pytest.raises(InputError, match="spec file not found"):
        load_spec(str(tmp_path / "missing.yaml"))


def test_json_spec_files_keep_small_floats_as_numbers(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"learning_rate": 3e-05}))
    assert load_spec(str(path)) == {"learning_rate": 3e-05}
    path.write_text('{"learning_rate": }')
    with pytest.raises(InputError, match=r"spec\.json:1: not valid JSON"):
        load_spec(str(path))
