"""A persistent bash inside the sandbox, driven by the sandbox's REPL (stdlib only; runs in the container).

The REPL starts one `Shell` at the session's first `shell` request (repl_protocol.ShellRequest)
and runs every later one in it; the reply carries the command's output, its exit status, the
processes stopped after it and whether the shell was restarted. Nothing here runs on the host.

- One `bash --noprofile --norc` per session, in its own process group, stderr merged into stdout.
  Each command goes in as one line, `eval $'…'` of the command ANSI-C quoted, with stdin from
  /dev/null: `cd`, `export`, functions and variables persist to the next command; a syntax error is
  bash's own message, not a hung shell; a command cannot read the protocol.
- A command ends at a per-session marker line carrying its exit status; its output is written
  straight to the REPL's capture pipe (fd 1) as it arrives (so the REPL's cap applies while it is
  produced).
- The rule for leftovers: when a command returns, every other process of the shell's process
  group (background jobs, a fork bomb's children) is stopped and killed; the shell's state stays.
  What they wrote after the command's end is dropped and counted.
- On the call's timeout (the REPL interrupts this code) the whole shell is killed and a fresh one
  started in the working directory: directory and variables are reset, which the reply says.
"""

import os
import secrets
import signal
import subprocess
import time


class ShellOutcome:
    """What one command did besides its output."""

    def __init__(self, exit_code, stopped=0, stopped_output_dropped=0, restarted=False, cwd=""):
        self.exit_code = exit_code  # the shell's own exit status if it exited (it was restarted)
        self.stopped = stopped  # processes it left running, killed when it returned
        self.stopped_output_dropped = stopped_output_dropped  # bytes they wrote after the command's end
        self.restarted = restarted
        self.cwd = cwd  # the shell's working directory after the command ("" if it exited)


class Shell:
    def __init__(self, home):
        self.marker = "__tito_done_" + secrets.token_hex(8)
        self.home = home
        self.proc = None
        self.start()

    def start(self):
        env = dict(os.environ, PS1="", PS2="", HISTFILE="/dev/null", TERM="dumb")
        # SIGHUP ignored (inherited through exec): stopping the group to empty it must not hang the shell
        # up (gVisor sends SIGHUP to an orphaned group with stopped members when one exits).
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-c", "trap '' HUP; exec bash --noprofile --norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, cwd=self.home, env=env, start_new_session=True, bufsize=0)

    @staticmethod
    def quote(command):
        """The command as a bash $'…' string: one line, whatever it holds."""
        out = []
        for ch in command:
            if ch == "\\" or ch == "'":
                out.append("\\" + ch)
            elif ch == "\n":
                out.append("\\n")
            elif ord(ch) < 32 or ord(ch) == 127:
                out.append("\\x%02x" % ord(ch))
            else:
                out.append(ch)
        return "$'" + "".join(out) + "'"

    def run(self, command):
        """Runs one command; its output goes to fd 1 as it comes. Returns a ShellOutcome."""
        # The marker line carries the exit status and the working directory (control characters as '?').
        # disown: the jobs stopped below are not reported by bash at the next command (the reply says so instead).
        line = ("eval %s </dev/null; printf '\\n%s %%d %%s\\n' $? \"${PWD//[[:cntrl:]]/?}\"; disown -a\n"
                % (self.quote(command), self.marker))
        try:
            self.proc.stdin.write(line.encode("utf-8", "surrogateescape"))
            status, cwd = self._relay()
        except BaseException:  # the call's timeout (or an interrupt): the shell is mid-command
            self.restart()
            raise
        stopped = self._kill_leftovers()
        late = self._drain() if stopped else 0  # what they wrote after the marker: not this command's
        if status is None:  # the shell itself exited (`exit 3`): its status is the command's
            exited = self.proc.wait()
            self.restart()
            return ShellOutcome(exited, stopped, late, restarted=True)
        return ShellOutcome(status, stopped, late, cwd=cwd)

    def _relay(self):
        """Copies the shell's output to fd 1 up to the marker line: (exit status, working directory), or
        (None, "") at EOF."""
        tag = ("\n" + self.marker + " ").encode()
        pending = b""
        fd = self.proc.stdout.fileno()
        while True:
            data = os.read(fd, 65536)
            if not data:
                os.write(1, pending)
                return None, ""
            pending += data
            at = pending.find(tag)
            if at >= 0:
                end = pending.find(b"\n", at + len(tag))
                while end < 0:
                    more = os.read(fd, 65536)
                    if not more:
                        return None, ""
                    pending += more
                    end = pending.find(b"\n", at + len(tag))
                os.write(1, pending[:at])
                status, _, cwd = pending[at + len(tag):end].partition(b" ")
                return int(status), cwd.decode("utf-8", "replace")
            # Keep back what could be the start of the marker; pass the rest on now.
            keep = len(tag) - 1
            if len(pending) > keep:
                os.write(1, pending[:-keep])
                pending = pending[-keep:]

    def _drain(self):
        """Reads and drops what is waiting in the shell's output pipe; how many bytes."""
        fd = self.proc.stdout.fileno()
        os.set_blocking(fd, False)
        dropped = 0
        try:
            while True:
                data = os.read(fd, 65536)
                if not data:
                    break
                dropped += len(data)
        except BlockingIOError:
            pass
        finally:
            os.set_blocking(fd, True)
        return dropped

    def _group(self):
        pgid = self.proc.pid
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == pgid:
                continue
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()  # state, ppid, pgrp, ...
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":  # zombies are gone already
                found.append(int(name))
        return found

    def _kill_leftovers(self):
        """Kills every process of the shell's group but the shell; how many there were."""
        if self.proc.poll() is not None:
            return 0
        first = self._group()
        if not first:
            return 0
        killed = set()
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGSTOP)  # freeze the group: nothing forks while it is emptied
            for _ in range(20):
                members = self._group()
                if not members:
                    break
                for pid in members:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.add(pid)
                    except OSError:
                        pass
                time.sleep(0.005)
        finally:
            try:
                os.killpg(pgid, signal.SIGCONT)
            except OSError:
                pass
        return len(killed)

    def restart(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        self.start()
