"""A child process of `blink serve`: started pinned and parent-bound, its stderr relayed by a thread.

Until the server is ready the child's stderr is held back, so a failed start ends in one line (ours,
quoting the child's last line) instead of a traceback; once ready, lines pass straight through. A start
stopped by a signal shows what was held (its start-up phase lines, blink/util/startup.py).
"""
from __future__ import annotations

import http.client
import subprocess
import sys
import threading
import urllib.parse

from blink.entrypoints.processes import child_command


class Child:
    def __init__(self, role: str, command: list[str], cpus: str | None, env: dict | None = None,
                 nice: int | None = None):
        self.role = role
        self.process = subprocess.Popen(child_command(command, cpus, nice), stdin=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, env=env, process_group=0)
        self.pid = self.process.pid
        self.last_line = ""
        self._held: list[str] = []
        self._live = False
        self._lock = threading.Lock()
        self._relay = threading.Thread(target=self._relay_stderr, name=f"stderr-{role}", daemon=True)
        self._relay.start()

    def _relay_stderr(self) -> None:
        for raw in self.process.stderr:
            line = raw.decode("utf-8", "replace")
            with self._lock:
                if line.strip():
                    self.last_line = line.strip()
                if self._live:
                    sys.stderr.write(line)
                    sys.stderr.flush()
                else:
                    self._held.append(line)

    def go_live(self) -> None:
        """The server is up: show what the child said while starting, and everything from now on."""
        with self._lock:
            sys.stderr.writelines(self._held)
            sys.stderr.flush()
            self._held.clear()
            self._live = True

    def exit_code(self) -> int | None:
        return self.process.poll()

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            try:
                self.process.send_signal(sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """After the process is gone: let the relay drain the pipe."""
        self._relay.join(timeout=2)
        self.process.stderr.close()


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True if GET `url` answers 200."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("GET", parts.path)
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()
