"""`kvtiers validate`, run as a user runs it: a subprocess, exit codes, stdout and
stderr, and no torch imported on the way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.clirun import run_kvtiers

from .conftest import REPO, GiB

EXAMPLE = str(REPO / "examples" / "config.json")
VLLM_EXAMPLE = str(REPO / "examples" / "vllm_kv_transfer_config.json")


def kvtiers(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m kvtiers ARGS` in a process of its own (tests/clirun.py)."""
    return run_kvtiers(args, cwd=REPO, timeout=120, input=stdin)


def test_valid_config_exits_0_with_a_summary() -> None:
    done = kvtiers("validate", EXAMPLE)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    assert out.startswith(f"valid: {EXAMPLE} (kvtiers config)\n")
    assert "cpu pool         2 GiB (2147483648 bytes), eviction lru, write_through" in out
    assert "0. memory (kvtiers-core " in out and "capacity_bytes=2 GiB" in out
    assert "1. faulty (kvtiers-core " in out
    assert "inner: memory (kvtiers-core " in out and "capacity_bytes=1 GiB" in out


def test_invalid_config_exits_2_with_one_line_per_problem() -> None:
    doc = {"cpu_bytes_to_use": "10G", "secondary_tiers": [{"type": "fss"}]}
    done = kvtiers("validate", json.dumps(doc))
    assert done.returncode == 2
    assert done.stdout == ""
    first, second = done.stderr.splitlines()
    assert first == 'error: $.cpu_bytes_to_use: expected an integer >= 1, found "10G" (string)'
    assert second.startswith("error: $.secondary_tiers[0].type: unknown tier 'fss'")
    assert "installed tiers:" in second
    assert "faulty" in second and "memory" in second


def test_bad_json_missing_file_and_huge_pool_exit_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"cpu_bytes_to_use": 1,,}')
    cases = {
        str(bad): f"error: $: invalid JSON in {bad} at line 1, column 24: Expecting property name",
        str(tmp_path / "missing.json"): "error: $: config file not found: ",
        json.dumps({"cpu_bytes_to_use": 1 << 60}): "error: $.cpu_bytes_to_use: 1 EiB ",
    }
    for arg, start in cases.items():
        done = kvtiers("validate", arg)
        assert done.returncode == 2, arg
        assert done.stderr.startswith(start), done.stderr
        assert "Traceback" not in done.stderr


def test_skip_machine_checks() -> None:
    done = kvtiers("validate", "--skip-machine-checks", json.dumps({"cpu_bytes_to_use": 1 << 60}))
    assert done.returncode == 0, done.stderr
    assert "1 EiB" in done.stdout


def test_vllm_config_warnings_go_to_stderr_and_json_is_a_kvtiers_config() -> None:
    done = kvtiers("validate", VLLM_EXAMPLE, "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "warning: $.kv_connector_extra_config.block_size: ignored, kvtiers has no use for it",
        "warning: $.kv_connector_extra_config.secondary_tiers[0].tier.n_read_threads: "
        'ignored, kvtiers has no use for it (did you mean "threads"?)',
        "warning: $.kv_connector_extra_config.secondary_tiers[0].tier.n_write_threads: "
        'ignored, kvtiers has no use for it (did you mean "threads"?)',
        'note: $.kv_connector_extra_config.spec_name: under "TieringOffloadingSpec" vLLM runs '
        'this stack with its own code: its CPU tier; kvtiers runs secondary_tiers[0] '
        '("kvtiers", through kvtiers-vllm). To let kvtiers run the CPU pool too, set '
        '"spec_name": "KvtiersOffloadingSpec" (kvtiers-vllm: kvtiers runs the CPU pool and '
        "every tier).",
    ]
    resolved = json.loads(done.stdout)
    assert resolved["cpu_bytes_to_use"] == 2 * GiB
    assert resolved["secondary_tiers"][0]["type"] == "memory"
    again = kvtiers("validate", done.stdout)
    assert again.returncode == 0 and again.stderr == ""


def test_warnings_are_printed_with_errors_too() -> None:
    doc = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": GiB,
        "secondary_tiers": [{"type": "memory", "capacity_byte": 1}],
    }
    done = kvtiers("validate", json.dumps(doc))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        'warning: $.secondary_tiers[0].type: vLLM has no "memory" tier (its own: example, fs, '
        'kvcr, obj, p2p): under "TieringOffloadingSpec" vLLM refuses this entry ("Unknown '
        'secondary tier type"); write it as {"type": "kvtiers", "tier": {"type": "memory", '
        "...}}",
        "warning: $.secondary_tiers[0].capacity_byte: ignored, kvtiers has no use for it "
        '(did you mean "capacity_bytes"?)',
        "error: $.secondary_tiers[0].capacity_bytes: missing; expected an integer >= 1 (RAM the "
        "tier may hold, in bytes (block bytes only))",
    ]


def test_stdin() -> None:
    done = kvtiers("validate", "-", stdin=json.dumps({"cpu_bytes_to_use": GiB}))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("valid: standard input (kvtiers config)")
    assert "1 GiB" in done.stdout
    empty = kvtiers("validate", "-", stdin="")
    assert empty.returncode == 2
    assert empty.stderr == (
        "error: $: invalid JSON in standard input at line 1, column 1: Expecting value\n"
    )
    path_like = kvtiers("validate", "-", stdin="examples/config.json")
    assert path_like.returncode == 2
    assert path_like.stderr.startswith("error: $: invalid JSON in standard input")


def test_validate_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from kvtiers.cli import main\n"
        f"rc = main(['validate', {EXAMPLE!r}])\n"
        f"rc2 = main(['validate', {VLLM_EXAMPLE!r}])\n"
        "heavy = sorted(m for m in ('torch', 'numpy') if m in sys.modules)\n"
        "print('RESULT', rc, rc2, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "RESULT 0 0 []"


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    # `kvtiers validate --json CFG | head -2`, for every command that prints.
    for args in (["validate", "--json", EXAMPLE], ["validate", "--show", EXAMPLE],
                 ["plugins", "--json"], ["plugins", "--options", "faulty"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvtiers", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "80"},
        )
        assert proc.stdout is not None and proc.stderr is not None
        # Closed before the command (still starting) writes a byte: `head` leaving.
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141, (args, err)  # 128 + SIGPIPE, as `yes | head`
        assert "Traceback" not in err and "BrokenPipe" not in err, (args, err)


def test_validate_show_lists_every_option_with_defaults_marked() -> None:
    done = kvtiers("validate", "--show", EXAMPLE)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"valid: {EXAMPLE} (kvtiers config)"
    assert "cpu_bytes_to_use          2147483648 (2 GiB)" in lines
    assert 'eviction_policy           "lru"  (default)' in lines
    assert "breaker.failures          5  (default)" in lines
    assert "secondary_tiers           2 tiers" in lines
    assert "  [1]                     faulty (kvtiers-core " in done.stdout
    assert "    inner                 memory (kvtiers-core " in done.stdout
    assert "      threads             1  (default)" in lines
    assert '    ops                   ["load", "store", "lookup"]  (default)' in lines


def test_notes_are_printed_with_errors_too() -> None:
    doc = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": "1G",
            "secondary_tiers": [{"type": "fs", "root_dir": "/does/not/exist"}],
        },
    }
    done = kvtiers("validate", "--skip-machine-checks", json.dumps(doc))
    assert done.returncode == 2
    err = done.stderr.splitlines()
    assert err[0].startswith('note: $.kv_connector_extra_config.spec_name: under '
                             '"TieringOffloadingSpec" vLLM runs this stack with its own code')
    assert err[1].startswith(
        "note: $.kv_connector_extra_config.secondary_tiers[0].capacity_bytes: not set (vLLM's "
        "tier section has no such key); derived where this config is loaded with machine checks"
    )
    assert err[2].startswith('error: $.kv_connector_extra_config.cpu_bytes_to_use: expected ')


def test_the_crashes_an_operator_found_are_clear_errors() -> None:
    big = "1" + "0" * 400
    cases = {
        json.dumps({"kv_connector": ["x"], "kv_role": "kv_both"}):
            'error: $.kv_connector: expected a string or null, found ["x"] (array)',
        f'{{"cpu_bytes_to_use": {big}}}': "error: $.cpu_bytes_to_use: an integer of 401 digits",
        "": "error: $: the config is an empty string",
    }
    for arg, first in cases.items():
        for extra in ([], ["--skip-machine-checks"]):
            done = kvtiers("validate", *extra, arg)
            assert done.returncode == 2, (arg, done.stderr)
            assert done.stderr.splitlines()[0].startswith(first), done.stderr
            assert "Traceback" not in done.stderr


def test_skip_machine_checks_help_says_what_it_skips() -> None:
    done = kvtiers("validate", "--help")
    text = " ".join(done.stdout.split())
    assert "its memory, each tier's directories and their filesystems" in text


def test_a_vllm_config_says_which_system_runs_which_tier(tmp_path: Path) -> None:
    """Under vLLM's own tiering spec vLLM runs its own fs tier: the summary must not
    read as if vLLM enforced kvtiers' capacity; a tier vLLM does not have is
    refused by vLLM, so validate warns; the ways to run kvtiers' tiers are named."""
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": GiB,
             "secondary_tiers": [
                 {"type": "fs", "root_dir": str(tmp_path), "n_write_threads": 2},
                 {"type": "kvtiers", "tier": {"type": "fs", "root_dir": str(tmp_path / "b"),
                                              "capacity_bytes": GiB}},
                 {"type": "memory", "capacity_bytes": GiB}]}
    doc = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": extra}
    (tmp_path / "b").mkdir()
    done = kvtiers("validate", json.dumps(doc))
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert ("  runs under       vLLM's TieringOffloadingSpec: vLLM's own CPU tier, and vLLM's "
            "own tiers where marked below (kvtiers' reading of their options is not what vLLM "
            "enforces: see the note)") in out
    first = out.index(next(line for line in out if line.startswith("    0. fs ")))
    assert out[first + 1] == ("       vLLM runs its own 'fs' tier here, not kvtiers': the "
                              "options above are kvtiers' reading")
    assert out[first + 3] == "       kvtiers runs this tier, below vLLM's CPU tier"
    err = done.stderr
    base = "$.kv_connector_extra_config"
    assert (f'warning: {base}.secondary_tiers[2].type: vLLM has no "memory" tier (its own: '
            'example, fs, kvcr, obj, p2p): under "TieringOffloadingSpec" vLLM refuses this '
            'entry ("Unknown secondary tier type"); write it as {"type": "kvtiers", "tier": '
            '{"type": "memory", ...}}') in err
    (note,) = [line for line in err.splitlines() if line.startswith(f"note: {base}.spec_name")]
    assert "its own tier for secondary_tiers[0] (\"fs\")" in note
    assert "kvtiers' capacity_bytes, verified hits and warm restart do not apply" in note
    assert "kvtiers runs secondary_tiers[1] (\"kvtiers\", through kvtiers-vllm)" in note
    assert '{"type": "kvtiers", "tier": {"type": "fs", ...}}' in note
    assert '"spec_name": "KvtiersOffloadingSpec"' in note
    # under kvtiers-vllm's spec kvtiers runs everything: no such note, no marks
    extra["spec_name"] = "KvtiersOffloadingSpec"
    done = kvtiers("validate", json.dumps(doc))
    assert done.returncode == 0, done.stderr
    assert ("  runs under       vLLM's KvtiersOffloadingSpec: kvtiers runs the CPU pool and "
            "every tier") in done.stdout.splitlines()
    assert "vLLM runs its own" not in done.stdout and "spec_name: under" not in done.stderr
