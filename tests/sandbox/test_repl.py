"""The REPL's behaviour over the real channel: state, outputs, errors, caps, timeouts."""

from __future__ import annotations

import time


async def test_state_persists_variables_imports_files(sandbox):
    r = await sandbox.execute("import math\nx = 41\ndef f(a):\n    return a + 1\n"
                              "open('notes.txt', 'w').write('kept')")
    assert r.ok, r
    r = await sandbox.execute("x += 1\nf(x), math.pi > 3, open('notes.txt').read()")
    assert r.ok, r
    assert r.value == "(43, True, 'kept')"
    # Files written in the workdir are importable, like a script directory.
    await sandbox.execute("open('helper.py', 'w').write('VALUE = 7\\n')")
    r = await sandbox.execute("import helper; helper.VALUE")
    assert r.value == "7", r


async def test_stdout_stderr_value_and_traceback(sandbox):
    r = await sandbox.execute("import sys\nprint('out')\nprint('err', file=sys.stderr)\n[1, 2]")
    assert (r.stdout, r.stderr, r.value, r.error) == ("out\n", "err\n", "[1, 2]", None)
    r = await sandbox.execute("y = 5")  # a statement has no value
    assert r.value is None and r.ok
    r = await sandbox.execute("None")
    assert r.value is None
    r = await sandbox.execute("def g():\n    return 1 / 0\nprint('before')\ng()")
    assert r.stdout == "before\n"
    assert r.error and "ZeroDivisionError: division by zero" in r.error
    assert "line 2, in g" in r.error and "return 1 / 0" in r.error
    assert "repl_server" not in r.error  # the REPL's own frames are hidden
    assert not r.lost and not r.timed_out
    r = await sandbox.execute("def broken(:\n    pass")
    assert r.error and "SyntaxError" in r.error


async def test_output_of_subprocesses_and_c_level_writes_is_captured(sandbox):
    r = await sandbox.execute("import os, subprocess\nos.write(1, b'raw\\n')\n"
                              "subprocess.run(['sh', '-c', 'echo child; echo oops >&2'])\n"
                              "os.system('echo sys')")
    assert r.stdout == "raw\nchild\nsys\n", r
    assert r.stderr == "oops\n"
    assert r.value == "0"


async def test_system_exit_is_an_error_and_the_repl_survives(sandbox):
    await sandbox.execute("keep = 'me'")
    for code in ("import sys; sys.exit(2)", "exit()", "raise SystemExit('bye')", "quit()"):
        r = await sandbox.execute(code)
        assert r.error and "SystemExit" in r.error, (code, r)
        assert not r.lost and sandbox.alive
    r = await sandbox.execute("print('still here'); keep")
    assert r.stdout == "still here\n" and r.value == "'me'"


async def test_user_cannot_break_the_protocol_streams(sandbox):
    r = await sandbox.execute("import os, sys\nsys.stdout.close()\nos.close(1)\nos.close(0)")
    assert not r.lost, r
    r = await sandbox.execute("print('back'); input()")
    assert r.stdout == "back\n" and "EOFError" in (r.error or "")


def _rss_kib() -> int:
    """Current resident memory of this process (ru_maxrss is a lifetime peak and could hide growth)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


async def test_output_is_capped_while_produced(sandbox):
    cap = sandbox.config.output_cap_bytes
    rss_before = _rss_kib()
    t0 = time.monotonic()
    # 400 MB of output from Python, plus 100 MB from a subprocess on stderr.
    r = await sandbox.execute("import sys, subprocess\nchunk = 'x' * (1 << 20)\n"
                              "for _ in range(400):\n    sys.stdout.write(chunk)\n"
                              "subprocess.run(['sh', '-c', 'head -c 100000000 /dev/zero | tr \"\\\\0\" e >&2'])\n"
                              "'done'", timeout_s=60)
    elapsed = time.monotonic() - t0
    assert r.ok and r.value == "'done'", r.error
    assert r.stdout_truncated and r.stderr_truncated
    assert len(r.stdout.encode()) == cap and set(r.stdout) == {"x"}
    assert len(r.stderr.encode()) == cap and set(r.stderr) == {"e"}
    assert r.stdout_dropped == 400 * (1 << 20) - cap
    assert r.stderr_dropped == 100_000_000 - cap
    assert elapsed < 60, elapsed  # the call's own timeout: the cap works while producing, not after
    grown_mib = (_rss_kib() - rss_before) / 1024
    assert grown_mib < 64, f"server memory grew by {grown_mib:.0f} MiB"
    # A huge last-expression value is capped too.
    r = await sandbox.execute("'y' * 10_000_000")
    assert len(r.value) < sandbox.config.value_cap_chars + 100 and "truncated" in r.value
    assert r.value_truncated and r.truncated and not r.stdout_truncated  # the second cap is reported too


async def test_infinite_loop_times_out_and_keeps_state(sandbox):
    await sandbox.execute("progress = 0")
    t0 = time.monotonic()
    r = await sandbox.execute("while True:\n    progress += 1", timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert r.timed_out and not r.lost, r
    # Within its timeout plus the grace (and scheduling slack on a loaded machine).
    assert 0.9 < elapsed < 1.0 + sandbox.config.interrupt_grace_s + 2, elapsed
    assert "timeout" in r.error
    r = await sandbox.execute("progress > 0")
    assert r.value == "True", r
    # A blocking sleep is interrupted as well; a catch-all `except Exception` cannot swallow it.
    t0 = time.monotonic()
    r = await sandbox.execute("import time\ntry:\n    time.sleep(60)\nexcept Exception:\n    pass",
                              timeout_s=0.5)
    assert r.timed_out and not r.lost and time.monotonic() - t0 < 0.5 + sandbox.config.interrupt_grace_s + 2


async def test_swallowed_alarm_is_escalated_to_sigint_with_state_kept(sandbox):
    # Code that swallows the REPL's own timeout exception is stopped by the host's SIGINT.
    await sandbox.execute("kept = 'yes'")
    t0 = time.monotonic()
    r = await sandbox.execute(
        "while True:\n    try:\n        while True:\n            pass\n"
        "    except BaseException as e:\n        if type(e).__name__ == 'KeyboardInterrupt':\n"
        "            raise\n", timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert r.timed_out and not r.lost, r
    assert r.error.rstrip().splitlines()[-1].startswith("(interrupted") and "KeyboardInterrupt" in r.error
    assert "repl_server" not in r.error
    assert elapsed < 1.0 + sandbox.config.interrupt_grace_s + 1.0, elapsed
    assert (await sandbox.execute("kept")).value == "'yes'"


async def test_interrupt_ignoring_loop_is_killed_and_reported_lost(sandbox):
    cfg = sandbox.config
    t0 = time.monotonic()
    r = await sandbox.execute("while True:\n    try:\n        while True:\n            pass\n"
                              "    except BaseException:\n        pass", timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert r.lost and r.timed_out, r
    assert "ignored" in r.lost_reason
    assert elapsed < 1.0 + cfg.interrupt_grace_s + cfg.kill_grace_s + 2.0, elapsed
    assert not sandbox.alive
    r = await sandbox.execute("1")
    assert r.lost and r.lost_reason


async def test_oversized_code_is_rejected_without_losing_the_sandbox(sandbox):
    r = await sandbox.execute("#" * (sandbox.config.max_code_bytes + 1))
    assert r.error and "limit" in r.error and not r.lost
    r = await sandbox.execute("1 + 1")
    assert r.value == "2"


async def test_a_child_forked_while_another_thread_prints_can_print(sandbox):
    # The fork may come while the printing thread holds a stream's lock; the child gets fresh streams.
    r = await sandbox.execute(
        "import os, sys, threading, time\nstop = False\n"
        "def spam():\n    while not stop:\n        print('s' * 50)\n"
        "t = threading.Thread(target=spam); t.start()\nok = hung = 0\n"
        "for _ in range(20):\n    pid = os.fork()\n"
        "    if pid == 0:\n        print('child'); sys.stdout.flush(); os._exit(0)\n"
        "    for _ in range(100):\n        if os.waitpid(pid, os.WNOHANG)[0]:\n            ok += 1\n            break\n"
        "        time.sleep(0.01)\n"
        "    else:\n        hung += 1; os.kill(pid, 9); os.waitpid(pid, 0)\n"
        "stop = True; t.join()\nok, hung", timeout_s=60)
    assert r.value == "(20, 0)", r
