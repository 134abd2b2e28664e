from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from checkpoints_tools import matching, modules
from checkpoints_tools.cli import main
from checkpoints_tools.fix import apply_fix, hf_overrides, rollback
from checkpoints_tools.header import read_checkpoint
from checkpoints_tools.scan import OVER_IGNORED, UNQUANTIZED, scan
from tests.fixtures.checkpoints import glm_like, qwen3_next_like


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.mark.parametrize(
    ("build", "fmt", "mtp_layer", "golden"),
    [
        (lambda p: glm_like(p), "modelopt", "model.layers.5", ["model.layers.5.*"]),
        (
            lambda p: glm_like(p, nested=True),
            "modelopt",
            "model.language_model.layers.5",
            ["model.language_model.layers.5.*", "model.layers.5.*"],
        ),
        (
            lambda p: glm_like(p, fmt="compressed-tensors"),
            "compressed-tensors",
            "model.layers.5",
            ["re:model[.]layers[.]5[.]"],
        ),
        (qwen3_next_like, "modelopt", "mtp", ["mtp.*"]),
    ],
)
def test_scan_finds_the_bf16_mtp_layer_and_emits_golden_patterns(
    tmp_path: Path,
    build,
    fmt: str,
    mtp_layer: str,
    golden: list[str],  # type: ignore[no-untyped-def]
) -> None:
    build(tmp_path)
    r = scan(tmp_path)
    assert r.format == fmt and r.mtp_layers == [mtp_layer]
    assert not r.consistent
    assert {p.kind for p in r.problems} == {UNQUANTIZED}
    assert all(p.mtp_layer == mtp_layer and p.storage == "bf16" for p in r.problems)
    assert len(r.problems) == 10  # q/k/v/o + 2 experts × gate/up/down; router and eh_proj are not flagged
    assert r.fix_patterns == golden

    # the patterns match every flagged module, and every other module they match is stored unquantized
    linear = {n: m for n, m in modules.group(read_checkpoint(tmp_path)).items() if m.linear}
    flagged = {p.module for p in r.problems}
    matched = {n for n in linear if matching.is_ignored(r.format, n, r.fix_patterns)}  # type: ignore[arg-type]
    assert flagged <= matched
    assert all(not linear[n].quantized for n in matched)
    assert all(n.startswith(mtp_layer) for n in matched)


def test_fix_appends_to_both_nested_lists_with_backup_and_is_idempotent(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    glm_like(tmp_path, nested=True)
    original = files(tmp_path)
    assert main(["fix", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    added = re.findall(r'^\+\s+"model\.language_model\.layers\.5\.\*"', out, re.M)
    assert len(added) == 2  # appended to both nested lists, shown in the diff
    cfg = json.loads((tmp_path / "config.json").read_text())
    want = ["lm_head", "*mlp.gate", "model.language_model.layers.5.*", "model.layers.5.*"]
    assert cfg["quantization_config"]["ignore"] == want
    assert cfg["text_config"]["quantization_config"]["ignore"] == want
    backups = [p for p in tmp_path.iterdir() if p.name.startswith("config.json.bak-")]
    assert len(backups) == 1 and backups[0].read_bytes() == original["config.json"]
    assert scan(tmp_path).consistent and main(["scan", str(tmp_path)]) == 0

    after_first = files(tmp_path)
    assert main(["fix", str(tmp_path)]) == 0  # second run: nothing to change
    assert "nothing to change" in capsys.readouterr().out
    assert files(tmp_path) == after_first

    assert main(["rollback", str(tmp_path)]) == 0
    restored = files(tmp_path)
    assert restored["config.json"] == original["config.json"]  # byte for byte
    assert not scan(tmp_path).consistent


def test_already_fixed_checkpoint_is_consistent_and_untouched(tmp_path: Path) -> None:
    glm_like(tmp_path, ignore=["lm_head", "*mlp.gate", "model.layers.5.*"])
    before = files(tmp_path)
    assert main(["scan", str(tmp_path)]) == 0
    assert main(["fix", str(tmp_path)]) == 0
    assert files(tmp_path) == before


def test_quantized_module_inside_an_excluded_one_is_flagged(tmp_path: Path) -> None:
    glm_like(
        tmp_path,
        fmt="compressed-tensors",
        ignore=["lm_head", "re:.*mlp[.]gate$", "re:model[.]layers[.]5[.]", "model.layers.0.self_attn.q_proj"],
    )
    r = scan(tmp_path)
    assert [(p.module, p.kind) for p in r.problems] == [("model.layers.0.self_attn.q_proj", OVER_IGNORED)]
    assert r.fix_patterns == []
    assert main(["fix", str(tmp_path)]) == 1  # cannot be fixed by appending


def test_hf_overrides_carry_the_whole_config_with_patterns_appended(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    glm_like(tmp_path)
    before = files(tmp_path)
    assert main(["fix", str(tmp_path), "--emit", "hf-overrides"]) == 0
    emitted = json.loads(capsys.readouterr().out)
    assert emitted == hf_overrides(tmp_path, scan(tmp_path))
    qc = emitted["quantization_config"]
    assert qc["quant_algo"] == "NVFP4" and qc["ignore"] == ["lm_head", "*mlp.gate", "model.layers.5.*"]
    assert files(tmp_path) == before


def test_exit_codes(tmp_path: Path) -> None:
    assert main(["scan", str(tmp_path / "nope")]) == 2
    glm_like(tmp_path)
    assert main(["scan", str(tmp_path), "--json"]) == 1
    with pytest.raises(FileNotFoundError):
        rollback(tmp_path)
    assert main(["rollback", str(tmp_path)]) == 2


def test_modelopt_and_ct_matching_semantics() -> None:
    assert matching.modelopt_matches("model.layers.3.mlp.gate", "*mlp.gate")
    assert matching.modelopt_matches("model.layers.3.mlp.gate", "mlp.gate")  # plain substring
    assert matching.modelopt_matches("model.language_model.layers.5.x", "model.layers.5")  # stripped
    assert not matching.modelopt_matches("model.layers.50.x", "model.layers.5.*")
    assert matching.ct_matches("model.layers.5.x", "re:model[.]layers[.]5[.]")
    assert not matching.ct_matches("model.layers.50.x", "re:model[.]layers[.]5[.]")
    assert not matching.ct_matches("a.model.layers.5.x", "re:model[.]layers[.]5[.]")  # anchored at start
    assert not matching.ct_matches("model.layers.5.x", "model.layers.5")  # exact only, no substring


def test_apply_fix_without_problems_writes_nothing(tmp_path: Path) -> None:
    glm_like(tmp_path, ignore=["lm_head", "*mlp.gate", "model.layers.5.*"])
    result = apply_fix(tmp_path, scan(tmp_path))
    assert result.changed == {} and not any(p.name.startswith(".checkpoints") for p in tmp_path.iterdir())


def test_compiled_matcher_answers_exactly_as_the_format_rules() -> None:
    names = [
        "lm_head",
        "model.layers.5.mlp.gate",
        "model.layers.50.mlp.gate",
        "model.language_model.layers.5.self_attn.q_proj",
        "mtp.fc",
        "mtp.layers.0.mlp.experts.3.up_proj",
        "visual.blocks.0.attn.qkv",
    ]
    pattern_sets = [
        [],
        ["lm_head"],
        ["model.layers.5.*", "*mlp.gate", "mtp"],
        ["model.layers.5"],  # modelopt: a substring; also on the language_model-stripped name
        ["re:model[.]layers[.]5[.]", "re:mtp[.]", "mtp.fc", "re:(unclosed"],  # a broken regex never matches
        ["re:.*experts", "visual.*", "[!m]*"],
    ]
    for fmt in ("modelopt", "compressed-tensors"):
        for patterns in pattern_sets:
            compiled = matching.ignore_matcher(fmt, patterns)  # type: ignore[arg-type]
            for name in names:
                assert compiled(name) == matching.is_ignored(fmt, name, patterns), (fmt, patterns, name)  # type: ignore[arg-type]


def test_fix_and_rollback_keep_the_config_file_mode(tmp_path: Path) -> None:
    glm_like(tmp_path)
    config = tmp_path / "config.json"
    config.chmod(0o640)  # a group-readable config, as a shared model folder has
    assert main(["fix", str(tmp_path)]) == 0
    assert config.stat().st_mode & 0o777 == 0o640
    assert main(["rollback", str(tmp_path)]) == 0
    assert config.stat().st_mode & 0o777 == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
