"""The port of an `llm serve --port 0` that a tool started, read from the server's log; and the count of a
test's checks (Checks).

openai_test.py, embeddings_test.py, tools_test.py and soak.py start the server with its stderr in a log file
and import this (python puts the script's folder, tools/, first on sys.path); stop and close_log end it
(finish: both, and the summary of its Checks).
Standard library only.
"""
import os
import re
import signal
import subprocess
import time


def listening_port(proc, log_path, seconds):
    """Reads log_path every 50 ms for the server's "listening on http://127.0.0.1:PORT" line and returns PORT;
    None once proc has exited without it, or after `seconds`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        with open(log_path, errors="replace") as f:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", f.read())
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None



def stop(proc):
    """SIGTERM, and the server's exit code (None: killed, after 60 s without exiting)"""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


def close_log(log, log_path, failed):
    """The server's log closed, its last 4000 characters printed when a check failed, and removed"""
    log.close()
    if failed:
        print(open(log_path).read()[-4000:])
    os.remove(log_path)


class Checks:
    """A test's checks counted: check(ok, what) counts one and prints "FAIL NAME: what" when ok is false;
    summary() prints "NAME: N passed, M failed" (and any note) and returns the exit status, 1 on a failure."""

    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def __call__(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL %s: %s" % (self.name, what), flush=True)

    def summary(self):
        print(f"{self.name}: {self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def finish(check, server, log, log_path):
    """A test's end: its server stopped (SIGTERM: it must exit 0), the log closed, the summary printed;
    returns the exit status"""
    code = stop(server)
    check(code == 0, f"the server exits 0 on SIGTERM (got {code})")
    close_log(log, log_path, check.failed)
    return check.summary()
