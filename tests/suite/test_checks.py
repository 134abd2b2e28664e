"""Every check kind on canned answers, passing and failing; code checks against hostile code."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from specexp.suite.cases import CheckSpec
from specexp.suite.checks import run_check
from specexp.suite.sandbox import run_python


def check(
    answer: str, tool_calls: list[dict[str, object]] | None = None, **spec: object
) -> tuple[bool | None, str]:
    return run_check(CheckSpec.model_validate(spec), answer, tool_calls or [], code_timeout_s=5)


def test_exact_ignores_case_whitespace_and_a_final_period() -> None:
    assert check(" Paris.\n", kind="exact", expected="Paris")[0] is True
    ok, reason = check("The capital is Paris", kind="exact", expected="Paris")
    assert ok is False and "expected 'Paris'" in reason


def test_regex_is_searched_across_lines() -> None:
    pattern = r"\A\s*(- \S.*\n){2}- \S.*\s*\Z"
    assert check("- red\n- green\n- blue", kind="regex", pattern=pattern)[0] is True
    assert check("Sure!\n- red\n- green\n- blue", kind="regex", pattern=pattern)[0] is False


def test_numeric_takes_the_last_number_with_tolerance() -> None:
    assert check("17 + 25 = 42", kind="numeric", value=42)[0] is True
    assert check("17 + 25 = 32", kind="numeric", value=42)[0] is False
    assert check("There are 3 r's.", kind="numeric", value=3)[0] is True
    assert check("1,024 tokens", kind="numeric", value=1024)[0] is True
    assert check("about 3.14", kind="numeric", value=3.1416, tolerance=0.01)[0] is True
    ok, reason = check("It has 2 r's", kind="numeric", value=3)
    assert ok is False and "2 ≠ 3" in reason
    assert check("none at all", kind="numeric", value=3)[0] is False


SCHEMA = {
    "type": "object",
    "required": ["name", "age"],
    "properties": {"name": {"const": "Alice"}, "age": {"type": "integer"}},
}


def test_json_schema_accepts_fenced_json_and_rejects_prose_or_wrong_types() -> None:
    assert check('```json\n{"name": "Alice", "age": 30}\n```', kind="json_schema", schema=SCHEMA)[0] is True
    ok, reason = check('Here you go: {"name": "Alice", "age": 30}', kind="json_schema", schema=SCHEMA)
    assert ok is False and reason.startswith("not JSON")
    ok, reason = check('{"name": "Alice", "age": "30"}', kind="json_schema", schema=SCHEMA)
    assert ok is False and "at age" in reason


def call(name: str, arguments: str) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_tool_call_checks_name_and_arguments_structurally() -> None:
    spec = {"kind": "tool_call", "function": "get_weather", "arguments": {"city": "Paris"}}
    assert check("", [call("get_weather", '{"city": "paris", "unit": "C"}')], **spec)[0] is True
    assert check("It is sunny in Paris.", [], **spec) == (False, "no tool call (expected get_weather)")
    assert "called 'get_time'" in check("", [call("get_time", "{}")], **spec)[1]
    assert "expected 'Paris'" in check("", [call("get_weather", '{"city": "Rome"}')], **spec)[1]
    assert "not JSON" in check("", [call("get_weather", "{city: Paris")], **spec)[1]


def test_code_passes_when_its_tests_pass_and_fails_with_the_assertion() -> None:
    tests = "assert add(2, 3) == 5"
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    assert check(good, kind="code", tests=tests) == (True, "code ran and its tests passed")
    ok, reason = check("def add(a, b):\n    return a - b", kind="code", tests=tests)
    assert ok is False and "AssertionError" in reason


def test_a_check_kind_without_its_fields_is_rejected() -> None:
    with pytest.raises(ValueError, match="needs pattern"):
        CheckSpec.model_validate({"kind": "regex"})


# -- hostile code: none of it may reach outside its jail ---------------------------------------


def test_code_cannot_write_outside_its_temp_dir() -> None:
    # a folder anyone may write to, outside /tmp (the jail shows its own /tmp instead of the
    # host's): only the jail's read-only mounts stand between the code and this folder
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path(__file__).parent
    folder = Path(tempfile.mkdtemp(dir=base, prefix="specexp-sandbox-target-"))
    folder.chmod(0o777)
    try:
        target = folder / "escaped.txt"
        run = run_python(f"open({str(target)!r}, 'w').write('x')")
        assert run.returncode != 0 and not target.exists()
        if not folder.is_relative_to("/tmp"):
            assert "Read-only file system" in run.stderr
    finally:
        shutil.rmtree(folder)
    home = Path.home() / "specexp-escaped.txt"
    run_python(f"open({str(home)!r}, 'w').write('x')")
    assert not home.exists()
    inside = run_python("open('/tmp/inside.txt', 'w').write('ok'); print(open('/tmp/inside.txt').read())")
    assert inside.returncode == 0 and inside.stdout.strip() == "ok"
    assert not Path("/tmp/inside.txt").exists()  # its /tmp was private and is gone


def test_code_has_no_network() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    server.settimeout(0.5)
    try:
        run = run_python(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)")
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever arrived on the host's loopback
    finally:
        server.close()
    assert run.returncode != 0 and "unreachable" in run.stderr.lower()


def test_code_is_killed_at_its_time_limit_sleeping_or_spinning() -> None:
    for code in ("while True: pass", "import time\nwhile True: time.sleep(1)"):
        t0 = time.monotonic()
        run = run_python(code, timeout_s=1.5)
        assert run.timed_out and time.monotonic() - t0 < 6


def _processes_with_cmdline(args: list[str]) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if [c.decode(errors="replace") for c in cmd] == args:
            found.append(int(proc.name))
    return found


def test_daemons_started_by_the_code_die_with_it() -> None:
    code = (
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execvp('sleep', ['sleep', '4243.5'])\n"
        "    os._exit(0)\n"
        "print('started a daemon')\n"
    )
    run = run_python(code, timeout_s=5)
    assert run.returncode == 0 and "started a daemon" in run.stdout
    time.sleep(0.3)
    assert _processes_with_cmdline(["sleep", "4243.5"]) == []


def test_code_cannot_remount_or_gain_privileges() -> None:
    run = run_python(
        "import subprocess\n"
        "r = subprocess.run(['mount', '-o', 'remount,rw', '/'], capture_output=True, text=True)\n"
        "print('rc', r.returncode)\n"
        "open('/etc/specexp-escaped', 'w')\n"
    )
    assert "rc 0" not in run.stdout and run.returncode != 0
    assert not Path("/etc/specexp-escaped").exists()
