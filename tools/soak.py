#!/usr/bin/env python3
"""Soak benchmark for `llm serve`: many concurrent streaming clients, some hostile ones, then health checks.

Run from the repository root (after `make llm`):

    python3 tools/soak.py --seconds 60                  # 256 streaming clients for 60 s
    python3 tools/soak.py --seconds 15 --clients 64     # a quick run

What it does:
  1. Starts `./llm serve -m testdata/models/stories260K.gguf --request-timeout 5 --port 0` (model, test-data
     folder and server flags are options) with its stderr in a log file, and waits for "listening on".
  2. Warm-up: --warmup seconds (default 5) of the same traffic, then reads the server's VmRSS as the baseline.
  3. For --seconds keeps --clients threads busy. Each loops: connect to 127.0.0.1:PORT, send a streaming
     POST /v1/completions (a short text prompt or 8..200 random token ids in [3, 500), max_tokens 8..128,
     temperature 0 or 0.8, ignore_eos), read the chunked SSE body to its end and check it is well formed
     (status 200, every event JSON, text deltas, finish_reason "length" on the last choice chunk, the usage
     chunk when asked for, `data: [DONE]`, the `0\\r\\n\\r\\n` terminator), then close. A tenth of the
     requests hang up at a random point instead (not failures: the server must just cope).
     Alongside: --hostile threads sending malformed requests (garbage, bad JSON, invalid fields, huge
     Content-Length, oversized headers, ...) that must get a 4xx JSON error or a clean close, never a 5xx or
     a hang; and --slow threads sending a request a byte at a time (slowloris) that the server must cut off
     after its --request-timeout with a 408 or a close.
  4. After the clients stop and --settle seconds pass: /metrics must show every KV block free again, the
     server's memory must be back near the baseline (within --mem-pct percent or --mem-mib MiB, the larger),
     GET /health must answer 200, and SIGTERM must stop the server with exit status 0.
     Memory: VmRSS is reported whole and split (from /proc/PID/smaps) into the KV pool mapping and the rest.
     The CPU backend callocs the pool (640 MiB for stories260K's default 32768 blocks), whose pages become
     resident as blocks are first used. The block manager hands out a freed block that holds no cached prefix
     first, so without prefix caching the pool's resident pages stay those of the busiest moment
     (--server-args "--request-timeout 5 --no-prefix-caching" --mem-check total passes); with it (the default)
     every full block stays cached after its request until the pool is full, and VmRSS grows by up to the
     pool's size without any leak. By default (--mem-check rest) only the growth outside the pool fails the
     run and a larger whole-VmRSS growth is a warning; --mem-check total judges all of VmRSS.
  5. Prints a summary (throughput, TTFT/e2e percentiles, failures with reasons) and exits 0 if all of the
     checks hold, 1 otherwise. Timing figures are reported, never judged.

Everything is bounded: each socket has a timeout, each request a deadline, and the run stops by itself after
--warmup + --seconds + --drain at most. It only connects to 127.0.0.1. Standard library only.
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time

from serve_port import listening_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEXT_PROMPTS = [
    "Once upon a time",
    "Lily and Ben went to the park",
    "The little dog was sad because",
    "One day, a big red ball",
    "Tom had a toy car. He",
    "The sun was shining and the birds",
    "Mom said, \"Let's bake a cake!\"",
    "There was a tiny fish in the sea",
    "Sue liked to draw pictures of",
    "The old tree in the garden",
    "Timmy wanted to fly like a bird",
    "It was a cold winter day",
]


# ------------------------------------------------------------------------------------------------------------
# Small HTTP/1.1 helpers over a raw socket
# ------------------------------------------------------------------------------------------------------------
class Failure(Exception):
    """A well-formed request got a response that is not right."""


class Reader:
    """Buffered reads from a socket with an overall deadline (each recv also has the socket's own timeout)."""

    def __init__(self, sock, deadline):
        self.sock = sock
        self.buf = b""
        self.deadline = deadline
        self.nbytes = 0  # bytes received in all

    def _more(self):
        if time.monotonic() > self.deadline:
            raise socket.timeout("request deadline passed")
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        self.nbytes += len(data)
        self.buf += data

    def line(self, limit=65536):
        while b"\r\n" not in self.buf:
            if len(self.buf) > limit:
                raise Failure("line too long")
            self._more()
        i = self.buf.index(b"\r\n")
        out, self.buf = self.buf[:i], self.buf[i + 2:]
        return out

    def exact(self, n):
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def headers(self):
        """The status code and the headers (lower-cased names) of a response."""
        status_line = self.line().decode("latin-1")
        m = re.match(r"HTTP/1\.[01] (\d{3}) ", status_line + " ")
        if not m:
            raise Failure(f"bad status line {status_line[:80]!r}")
        hdrs = {}
        while True:
            ln = self.line().decode("latin-1")
            if ln == "":
                break
            if ":" not in ln:
                raise Failure(f"bad header line {ln[:80]!r}")
            k, v = ln.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
        return int(m.group(1)), hdrs

    def body(self, hdrs):
        """A whole (non-streamed) body: by Content-Length, chunked, or up to the close."""
        if "content-length" in hdrs:
            return self.exact(int(hdrs["content-length"]))
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.line().split(b";")[0], 16)
                if size == 0:
                    self.line()
                    return out
                out += self.exact(size)
                if self.exact(2) != b"\r\n":
                    raise Failure("chunk not followed by CRLF")
        out = self.buf
        self.buf = b""
        try:
            while True:
                self._more()
                out += self.buf
                self.buf = b""
        except EOFError:
            return out


def connect(port, timeout):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def http_get(port, path, timeout=10.0):
    """(status, body bytes) of GET path; raises on a network error."""
    s = connect(port, timeout)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        r = Reader(s, time.monotonic() + timeout)
        status, hdrs = r.headers()
        return status, r.body(hdrs)
    finally:
        s.close()


def post_request(port, body, extra_headers="", keep_alive=False):
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra_headers}"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n").encode() + body


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def kv_pool_rss_kib(pid):
    """RSS (KiB) of the server's largest private read-write anonymous mapping: on the CPU backend that is the
    KV pool (K and V are two calloc'd arrays the kernel places side by side; malloc arenas' reserved parts are
    not read-write, thread stacks are 8 MiB), whose pages the block allocator touches for the first time as it
    hands blocks out in FIFO order, so it grows with traffic until the whole pool has been used. None when it
    cannot be read. A heuristic: with a pool smaller than a thread stack it finds something else."""
    best = None  # (size, rss)
    size = rss = None
    anon = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for ln in f:
                parts = ln.split()
                if re.match(r"^[0-9a-f]+-[0-9a-f]+$", parts[0]):
                    anon = len(parts) < 6 and parts[1] == "rw-p"
                    size = rss = None
                elif parts[0] == "Size:":
                    size = int(parts[1])
                elif parts[0] == "Rss:":
                    rss = int(parts[1])
                    if anon and (best is None or size > best[0]):
                        best = (size, rss)
    except (OSError, ValueError, IndexError):
        return None
    return best[1] if best else None


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1])
    except OSError:
        pass
    return None


# ------------------------------------------------------------------------------------------------------------
# Shared statistics
# ------------------------------------------------------------------------------------------------------------
class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.measuring = False      # after the warm-up
        self.t_measure = float("inf")  # when the measuring began
        self.ok = 0                 # well-formed requests answered correctly (all phases)
        self.ok_measured = 0        # ... of which finished while measuring
        self.text_events = 0        # SSE events with text (all phases)
        self.text_events_measured = 0
        self.usage_tokens = 0       # completion_tokens of usage chunks (requests that asked for one)
        self.failures = []          # (when, description)
        self.disconnects = 0        # hang-ups done mid-stream
        self.disconnects_measured = 0
        self.disconnect_done_first = 0  # the stream finished before the chosen hang-up point
        self.ttft = []              # seconds, requests started while measuring
        self.e2e = []
        self.hostile = {}           # case -> {outcome: count}
        self.hostile_failures = []
        self.slow = {}              # outcome -> count
        self.slow_cut_after = []    # seconds from the first byte to the server's cut-off
        self.slow_failures = []

    def fail(self, what):
        with self.lock:
            self.failures.append((time.strftime("%H:%M:%S"), what))

    def tally(self, table, key, outcome):
        with self.lock:
            d = table.setdefault(key, {})
            d[outcome] = d.get(outcome, 0) + 1


# ------------------------------------------------------------------------------------------------------------
# Well-formed streaming clients
# ------------------------------------------------------------------------------------------------------------
def random_request(rng):
    if rng.random() < 0.5:
        prompt = rng.choice(TEXT_PROMPTS)
    else:
        prompt = [rng.randrange(3, 500) for _ in range(rng.randint(8, 200))]
    req = {
        "prompt": prompt,
        "max_tokens": rng.randint(8, 128),
        "temperature": rng.choice([0, 0.8]),
        "stream": True,
        "ignore_eos": True,
    }
    if rng.random() < 0.5:
        req["stream_options"] = {"include_usage": True}
    return req


def hang_up(s, rng, stats):
    """A client leaving mid-request: sometimes a reset (SO_LINGER 0), sometimes a plain close."""
    if rng.random() < 0.5:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with stats.lock:
        stats.disconnects += 1
        stats.disconnects_measured += stats.measuring


def stream_once(args, port, rng, stats, cid):
    req = random_request(rng)
    if args.model_name:
        req["model"] = args.model_name
    keep_alive = rng.random() < 0.5
    disconnect = rng.random() < args.disconnect_frac
    # where a hang-up happens: after some bytes of the response, or after some events
    cut_bytes = rng.randint(0, 4000) if disconnect and rng.random() < 0.5 else None
    cut_events = rng.randint(0, req["max_tokens"]) if disconnect and cut_bytes is None else None
    body = json.dumps(req).encode()
    kind = "text" if isinstance(req["prompt"], str) else f"{len(req['prompt'])} ids"
    desc = (f"client {cid}: prompt={kind}"
            f" max_tokens={req['max_tokens']} temperature={req['temperature']}"
            f" usage={'stream_options' in req} keep_alive={keep_alive}")
    t0 = time.monotonic()
    ttft = None
    n_text = 0
    s = None
    try:
        s = connect(port, args.sock_timeout)
        s.sendall(post_request(port, body, keep_alive=keep_alive))
        if cut_bytes == 0 or cut_events == 0:
            hang_up(s, rng, stats)  # right after sending
            return
        r = Reader(s, t0 + args.request_deadline)
        status, hdrs = r.headers()
        if status != 200:
            rest = r.body(hdrs)[:300]
            raise Failure(f"status {status}: {rest!r}")
        if hdrs.get("transfer-encoding", "").lower() != "chunked":
            raise Failure(f"not chunked: headers {hdrs}")
        if not hdrs.get("content-type", "").startswith("text/event-stream"):
            raise Failure(f"content-type {hdrs.get('content-type')!r}")
        sse = b""
        n_events = 0
        finish = None
        usage = None
        done = False
        choice_after_finish = False
        while True:
            if cut_bytes is not None and r.nbytes >= cut_bytes:
                break
            size_line = r.line()
            try:
                size = int(size_line.split(b";")[0], 16)
            except ValueError:
                raise Failure(f"bad chunk size line {size_line[:40]!r}")
            if size == 0:
                if r.line() != b"":
                    raise Failure("no CRLF after the last chunk")
                break
            sse += r.exact(size)
            if r.exact(2) != b"\r\n":
                raise Failure("a chunk is not followed by CRLF")
            while b"\n\n" in sse:
                ev, sse = sse.split(b"\n\n", 1)
                n_events += 1
                if not ev.startswith(b"data: "):
                    raise Failure(f"event without 'data: ': {ev[:80]!r}")
                data = ev[6:]
                if done:
                    raise Failure(f"event after [DONE]: {data[:80]!r}")
                if data == b"[DONE]":
                    done = True
                    continue
                try:
                    obj = json.loads(data)
                except ValueError as e:
                    raise Failure(f"event is not JSON ({e}): {data[:120]!r}")
                if "error" in obj:
                    raise Failure(f"error event: {data[:200]!r}")
                if obj.get("object") != "text_completion" or not isinstance(obj.get("choices"), list):
                    raise Failure(f"not a text_completion chunk: {data[:200]!r}")
                if obj["choices"] == []:
                    if usage is not None or "usage" not in obj:
                        raise Failure(f"unexpected chunk without choices: {data[:200]!r}")
                    usage = obj["usage"]
                    continue
                if usage is not None:
                    raise Failure("a choice chunk after the usage chunk")
                if len(obj["choices"]) != 1 or obj["choices"][0].get("index") != 0:
                    raise Failure(f"bad choices: {data[:200]!r}")
                ch = obj["choices"][0]
                if not isinstance(ch.get("text"), str):
                    raise Failure(f"choice without text: {data[:200]!r}")
                if finish is not None:
                    choice_after_finish = True
                if ch["text"]:
                    n_text += 1
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    with stats.lock:
                        stats.text_events += 1
                        stats.text_events_measured += stats.measuring
                if ch.get("finish_reason") is not None:
                    finish = ch["finish_reason"]
                if cut_events is not None and n_events >= cut_events:
                    break
            if cut_events is not None and n_events >= cut_events:
                break
        if disconnect and not done:
            hang_up(s, rng, stats)
            return
        e2e = time.monotonic() - t0
        # a complete stream: check its shape
        if sse.strip():
            raise Failure(f"bytes after the last event: {sse[:80]!r}")
        if not done:
            raise Failure("no data: [DONE]")
        if finish is None:
            raise Failure("no finish_reason")
        if choice_after_finish:
            raise Failure("a choice chunk after the one with finish_reason")
        if finish != "length":
            raise Failure(f"finish_reason {finish!r} with ignore_eos (expected 'length')")
        if "stream_options" in req:
            if usage is None:
                raise Failure("include_usage asked, no usage chunk")
            if usage.get("completion_tokens") != req["max_tokens"]:
                raise Failure(f"usage.completion_tokens {usage.get('completion_tokens')} != max_tokens "
                              f"{req['max_tokens']}")
            if isinstance(req["prompt"], list) and usage.get("prompt_tokens") != len(req["prompt"]):
                raise Failure(f"usage.prompt_tokens {usage.get('prompt_tokens')} != {len(req['prompt'])}")
        elif usage is not None:
            raise Failure("a usage chunk that was not asked for")
        if n_text == 0:
            raise Failure("no text at all")
        if not keep_alive:
            # Connection: close: the server must close now, with nothing more
            try:
                extra = s.recv(1024)
            except socket.timeout:
                raise Failure("the server kept the connection open after Connection: close")
            if extra:
                raise Failure(f"bytes after the chunked terminator: {extra[:80]!r}")
        with stats.lock:
            stats.ok += 1
            if stats.measuring:
                stats.ok_measured += 1
            if stats.measuring and t0 >= stats.t_measure:
                stats.e2e.append(e2e)
                stats.ttft.append(ttft)
            if usage is not None:
                stats.usage_tokens += usage.get("completion_tokens", 0)
        if disconnect:
            with stats.lock:
                stats.disconnect_done_first += 1
    except Failure as e:
        stats.fail(f"{desc}: {e}")
    except (OSError, EOFError) as e:
        stats.fail(f"{desc}: {type(e).__name__}: {e} (after {time.monotonic() - t0:.1f} s, "
                   f"{n_text} text events)")
    finally:
        if s is not None:
            s.close()


def streaming_client(args, port, stop, stats, cid, seed):
    rng = random.Random(seed)
    while not stop.is_set():
        stream_once(args, port, rng, stats, cid)


# ------------------------------------------------------------------------------------------------------------
# Hostile clients
# ------------------------------------------------------------------------------------------------------------
def hostile_cases(port):
    """(name, rng -> bytes to send, whether to half-close after sending). Each must get a 4xx or a close."""
    h = f"Host: 127.0.0.1:{port}\r\n"
    pc = f"POST /v1/completions HTTP/1.1\r\n{h}"

    def post(body):
        return lambda rng: post_request(port, body.encode() if isinstance(body, str) else body)

    def raw(text):
        return lambda rng: text.encode()

    def garbage(rng, tail):
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 2000))) + tail

    return [
        ("garbage+CRLFCRLF", lambda rng: garbage(rng, b"\r\n\r\n"), False),
        ("garbage+EOF", lambda rng: garbage(rng, b""), True),
        ("bad JSON", post('{"prompt": "hi", "max_tokens": 4'), False),
        ("JSON not an object", post("[1, 2, 3]"), False),
        ("empty body", post(""), False),
        ("deep JSON", post('{"prompt": "hi", "x": ' + "[" * 5000 + "]" * 5000 + "}"), False),
        ("max_tokens -1", post('{"prompt": "hi", "max_tokens": -1}'), False),
        ("max_tokens 1e9", post('{"prompt": "hi", "max_tokens": 1000000000}'), False),
        ("max_tokens string", post('{"prompt": "hi", "max_tokens": "ten"}'), False),
        ("temperature -1", post('{"prompt": "hi", "temperature": -1}'), False),
        ("token id out of range", post('{"prompt": [1, 2, 99999], "max_tokens": 4}'), False),
        ("negative token id", post('{"prompt": [-5], "max_tokens": 4}'), False),
        ("empty prompt list", post('{"prompt": [], "max_tokens": 4}'), False),
        ("no prompt", post('{"max_tokens": 4}'), False),
        ("prompt too long", post(json.dumps({"prompt": [7] * 3000, "max_tokens": 4})), False),
        ("stream not bool", post('{"prompt": "hi", "stream": "yes"}'), False),
        ("stream_options 3", post('{"prompt": "hi", "stream": true, "stream_options": 3}'), False),
        ("body over 8 MiB", post(b'{"prompt": "' + b"a" * (9 << 20) + b'"}'), False),
        ("huge Content-Length", raw(f"{pc}Content-Type: application/json\r\n"
                                    "Content-Length: 99999999999999\r\n\r\n{"), False),
        ("Content-Length 9 GB", raw(f"{pc}Content-Length: 9000000000\r\n\r\n{{"), False),
        ("bad Content-Length", raw(f"{pc}Content-Length: 12x\r\n\r\n{{}}"), False),
        ("oversized header", raw(f"{pc}X-Filler: {'a' * 40000}\r\nContent-Length: 2\r\n\r\n{{}}"), False),
        ("3000 headers", raw(pc + "".join(f"X-H{i}: {i}\r\n" for i in range(3000))
                             + "Content-Length: 2\r\n\r\n{}"), False),
        ("bad chunked body", raw(f"{pc}Transfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"), False),
        ("unknown path", raw(f"POST /v1/nothing HTTP/1.1\r\n{h}Content-Length: 2\r\n\r\n{{}}"), False),
        ("GET /v1/completions", raw(f"GET /v1/completions HTTP/1.1\r\n{h}\r\n"), False),
        ("no HTTP version", raw("POST /v1/completions\r\n\r\n"), False),
        ("NUL in request line", raw(f"POST /v1/comp\x00letions HTTP/1.1\r\n{h}\r\n"), False),
    ]


def read_hostile_answer(s, deadline):
    """The answer to a hostile request: '4xx:CODE' with a JSON error body, 'close', 'reset', or a failure."""
    r = Reader(s, deadline)
    try:
        status, hdrs = r.headers()
    except EOFError:
        return "close" if not r.buf else f"bad: partial response {r.buf[:80]!r}", None
    except ConnectionResetError:
        return "reset", None
    try:
        body = r.body(hdrs)
    except ConnectionResetError:
        return f"{status // 100}xx:{status} (body cut by reset)", status
    if 400 <= status < 500:
        try:
            err = json.loads(body)
            if not isinstance(err, dict) or "error" not in err:
                return f"bad: {status} without an error object: {body[:120]!r}", status
        except ValueError:
            return f"bad: {status} with a body that is not JSON: {body[:120]!r}", status
        return f"4xx:{status}", status
    return f"bad: status {status}: {body[:200]!r}", status


def hostile_client(args, port, stop, stats, seed):
    rng = random.Random(seed)
    cases = hostile_cases(port)
    while not stop.is_set():
        name, make, half_close = rng.choice(cases)
        data = make(rng)
        t0 = time.monotonic()
        s = None
        try:
            s = connect(port, args.sock_timeout)
            try:
                s.sendall(data)
                if half_close:
                    s.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered (and closed) before it all went: read what it said
            outcome, status = read_hostile_answer(s, t0 + args.sock_timeout)
        except socket.timeout:
            outcome, status = "bad: no answer (hang)", None
        except (OSError, EOFError, Failure) as e:
            outcome, status = f"bad: {type(e).__name__}: {e}", None
        finally:
            if s is not None:
                s.close()
        dt = time.monotonic() - t0
        if not outcome.startswith("bad") and dt > args.request_timeout + 5:
            outcome = f"bad: answered only after {dt:.1f} s ({outcome})"
        key = outcome if not outcome.startswith("bad") else "FAILED"
        stats.tally(stats.hostile, name, key)
        if outcome.startswith("bad"):
            with stats.lock:
                stats.hostile_failures.append(f"{name}: {outcome}")
        stop.wait(args.hostile_pause)


def slow_client(args, port, stop, stats, seed):
    """Slowloris: a valid request, a byte every --slow-interval seconds; the server must cut it off."""
    rng = random.Random(seed)
    while not stop.is_set():
        req = {"prompt": "Once upon a time", "max_tokens": 8, "stream": rng.random() < 0.5}
        body = json.dumps(req).encode()
        data = post_request(port, body)
        if rng.random() < 0.5:  # headers at once, the body slowly
            cut = data.index(b"\r\n\r\n") + 4
        else:
            cut = 0
        t0 = time.monotonic()
        t_first = None
        outcome = None
        s = None
        try:
            s = connect(port, args.sock_timeout)
            if cut:
                s.sendall(data[:cut])
            t_first = time.monotonic()
            i = cut
            while i < len(data) and outcome is None:
                try:
                    s.sendall(data[i:i + 1])
                except (BrokenPipeError, ConnectionResetError):
                    break
                i += 1
                # wait for the next byte; stop waiting as soon as the server says something
                s.settimeout(args.slow_interval)
                try:
                    s.recv(1, socket.MSG_PEEK)
                    s.settimeout(args.sock_timeout)
                    break  # the server answered (or closed)
                except socket.timeout:
                    s.settimeout(args.sock_timeout)
                if time.monotonic() - t_first > args.request_timeout * 2 + 10:
                    outcome = f"bad: not cut off after {time.monotonic() - t_first:.1f} s"
            if outcome is None and i >= len(data):
                outcome = (f"bad: the whole request went through in {time.monotonic() - t_first:.1f} s "
                           "(raise --slow-interval or lower the server's --request-timeout)")
            if outcome is None:
                cut_after = time.monotonic() - t_first
                try:
                    res, status = read_hostile_answer(s, time.monotonic() + args.sock_timeout)
                except socket.timeout:
                    res, status = "bad: no answer (hang)", None
                if res.startswith("4xx") and status != 408:
                    res = f"bad: {res} (expected 408)"
                outcome = res
                if not res.startswith("bad"):
                    with stats.lock:
                        stats.slow_cut_after.append(cut_after)
                    if cut_after > args.request_timeout + 3:
                        outcome = f"bad: cut off only after {cut_after:.1f} s"
        except (OSError, EOFError, Failure) as e:
            outcome = f"bad: {type(e).__name__}: {e}"
        finally:
            if s is not None:
                s.close()
        with stats.lock:
            key = outcome if not outcome.startswith("bad") else "FAILED"
            stats.slow[key] = stats.slow.get(key, 0) + 1
            if outcome.startswith("bad"):
                stats.slow_failures.append(outcome)
        stop.wait(0.5)


# ------------------------------------------------------------------------------------------------------------
# The server
# ------------------------------------------------------------------------------------------------------------
def parse_metrics(text):
    def gauge(name):
        m = re.search(r"^" + re.escape(name) + r"(?:\{[^}]*\})?\s+(\S+)\s*$", text, re.M)
        return float(m.group(1)) if m else None
    out = {"free": gauge("llm:kv_cache_free_blocks"), "total": gauge("llm:kv_cache_blocks"),
           "running": gauge("vllm:num_requests_running"), "waiting": gauge("vllm:num_requests_waiting"),
           "preemptions": gauge("vllm:num_preemptions_total"),
           "success": {}}
    success = r'^vllm:request_success_total\{[^}]*finished_reason="(\w+)"[^}]*\}\s+(\S+)'
    for m in re.finditer(success, text, re.M):
        out["success"][m.group(1)] = int(float(m.group(2)))
    return out


def log_tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            lines = f.readlines()
        return "".join(lines[-n:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60, help="measured load time (default 60)")
    ap.add_argument("--clients", type=int, default=256, help="streaming clients (default 256)")
    ap.add_argument("--warmup", type=float, default=5, help="warm-up seconds before the memory baseline")
    ap.add_argument("--drain", type=float, default=90, help="seconds at most for in-flight requests to end")
    ap.add_argument("--settle", type=float, default=3, help="seconds of quiet before the final checks")
    ap.add_argument("--testdata", default=os.path.join(REPO, "testdata"), help="the test data folder")
    ap.add_argument("--model", help="GGUF model (default testdata/models/stories260K.gguf)")
    ap.add_argument("--model-name", help="the model name to send in requests (default: none sent)")
    ap.add_argument("--llm", default=os.path.join(REPO, "llm"), help="the llm binary")
    ap.add_argument("--server-args", default="--request-timeout 5",
                    help="extra server flags, space-separated (default '--request-timeout 5')")
    ap.add_argument("--log", help="server stderr log (default /tmp/llm-soak-PID.log)")
    ap.add_argument("--hostile", type=int, default=4, help="malformed-request clients (default 4)")
    ap.add_argument("--hostile-pause", type=float, default=0.2, help="seconds between hostile requests")
    ap.add_argument("--slow", type=int, default=2, help="slowloris clients (default 2)")
    ap.add_argument("--slow-interval", type=float, default=0.5, help="seconds between a slow client's bytes")
    ap.add_argument("--disconnect-frac", type=float, default=0.1, help="share of requests that hang up")
    ap.add_argument("--sock-timeout", type=float, default=60, help="every socket operation's timeout")
    ap.add_argument("--request-deadline", type=float, default=120, help="one streamed request's time at most")
    ap.add_argument("--mem-pct", type=float, default=10, help="RSS growth allowed, percent of the baseline")
    ap.add_argument("--mem-mib", type=float, default=16, help="RSS growth allowed, MiB (the larger bound)")
    ap.add_argument("--mem-check", choices=["rest", "total"], default="rest",
                    help="judge the growth of VmRSS outside the KV pool mapping (default; the pool's pages "
                         "fill in as blocks are used for the first time) or of all of VmRSS")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    args = ap.parse_args()

    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    model = args.model or os.path.join(args.testdata, "models", "stories260K.gguf")
    server_args = args.server_args.split()
    args.request_timeout = 30.0
    for i, a in enumerate(server_args):
        if a == "--request-timeout" and i + 1 < len(server_args):
            args.request_timeout = float(server_args[i + 1])
    log_path = args.log or os.path.join("/tmp", f"llm-soak-{os.getpid()}.log")

    for src in ("main.c", "server.c", "llm.h"):
        p = os.path.join(REPO, src)
        if os.path.exists(p) and os.path.exists(args.llm) and os.path.getmtime(p) > os.path.getmtime(
                args.llm):
            print(f"warning: {src} is newer than {args.llm} (make llm?)")

    cmd = [args.llm, "serve", "-m", model] + server_args + ["--port", "0"]
    print(f"soak: seed {seed}; starting {' '.join(cmd)} (log {log_path})", flush=True)
    log = open(log_path, "w")
    try:
        server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=REPO)
    except OSError as e:
        print(f"FAIL: cannot start {args.llm}: {e} (make llm?)")
        return 1
    port = listening_port(server, log_path, 120)
    if port is None:
        print(f"FAIL: the server did not start (exit {server.poll()}); log tail:\n{log_tail(log_path)}")
        if server.poll() is None:
            server.kill()
            server.wait()
        return 1
    pool = re.search(r"KV pool (\d+) blocks of (\d+)", log_tail(log_path, 50))
    print(f"soak: server pid {server.pid} on port {port}"
          + (f", KV pool {pool.group(1)} blocks of {pool.group(2)}" if pool else ""), flush=True)

    stats = Stats()
    stop = threading.Event()
    master = random.Random(seed)
    threads = []
    for i in range(args.clients):
        threads.append(threading.Thread(target=streaming_client, name=f"client-{i}",
                                        args=(args, port, stop, stats, i, master.randrange(1 << 30)),
                                        daemon=True))
    for i in range(args.hostile):
        threads.append(threading.Thread(target=hostile_client, name=f"hostile-{i}",
                                        args=(args, port, stop, stats, master.randrange(1 << 30)),
                                        daemon=True))
    for i in range(args.slow):
        threads.append(threading.Thread(target=slow_client, name=f"slow-{i}",
                                        args=(args, port, stop, stats, master.randrange(1 << 30)),
                                        daemon=True))
    for t in threads:
        t.start()

    # warm-up, then the baseline
    rss_samples = []
    crashed = None
    t_warm_end = time.monotonic() + args.warmup
    while time.monotonic() < t_warm_end and server.poll() is None:
        time.sleep(0.2)
    rss_base = rss_kib(server.pid)
    kv_base = kv_pool_rss_kib(server.pid)
    with stats.lock:
        stats.measuring = True
        stats.t_measure = time.monotonic()
        base_ok, base_events = stats.ok, stats.text_events
    t_measure = stats.t_measure
    print(f"soak: warm-up done ({stats.ok} requests OK); baseline VmRSS {rss_base} KiB "
          f"({kv_base} KiB of it in the KV pool); "
          f"measuring for {args.seconds:g} s", flush=True)

    t_end = t_measure + args.seconds
    next_report = time.monotonic() + 10
    while time.monotonic() < t_end:
        if server.poll() is not None:
            crashed = server.returncode
            break
        time.sleep(0.25)
        rss = rss_kib(server.pid)
        if rss:
            rss_samples.append(rss)
        if time.monotonic() >= next_report:
            next_report += 10
            with stats.lock:
                kv = kv_pool_rss_kib(server.pid)
                print(f"soak: t={time.monotonic() - t_measure:5.1f} s  ok={stats.ok_measured} "
                      f"fail={len(stats.failures)} disc={stats.disconnects_measured} "
                      f"text_events={stats.text_events_measured} VmRSS={rss} KiB "
                      f"(outside the KV pool {rss - kv if rss and kv else '?'} KiB)", flush=True)
    with stats.lock:
        stats.measuring = False
        t_stopped = time.monotonic()
        measured_ok = stats.ok_measured
        measured_events = stats.text_events_measured
        measured_disc = stats.disconnects_measured
    stop.set()
    duration = t_stopped - t_measure

    # drain: in-flight requests finish (each is bounded by its own deadline)
    drain_deadline = time.monotonic() + args.drain
    for t in threads:
        t.join(max(0.0, drain_deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    drain_s = time.monotonic() - t_stopped
    if crashed is None and server.poll() is not None:
        crashed = server.returncode
    time.sleep(args.settle)

    # final checks
    problems = []
    metrics = None
    health = None
    rss_end = kv_end = None
    exit_status = None
    if crashed is not None or server.poll() is not None:
        crashed = server.returncode
        problems.append(f"the server died during the run: exit status {crashed}")
    else:
        try:
            # blocks go back at the engine's next step; give it a few seconds
            for _ in range(20):
                status, body = http_get(port, "/metrics")
                metrics = parse_metrics(body.decode(errors="replace")) if status == 200 else None
                if metrics and metrics["free"] == metrics["total"]:
                    break
                time.sleep(0.5)
            if metrics is None:
                problems.append(f"/metrics answered {status}")
        except (OSError, EOFError, Failure) as e:
            problems.append(f"/metrics: {type(e).__name__}: {e}")
        rss_end = rss_kib(server.pid)
        kv_end = kv_pool_rss_kib(server.pid)
        try:
            health, _ = http_get(port, "/health")
        except (OSError, EOFError, Failure) as e:
            problems.append(f"/health: {type(e).__name__}: {e}")
        server.send_signal(signal.SIGTERM)
        try:
            exit_status = server.wait(timeout=45)
        except subprocess.TimeoutExpired:
            problems.append("the server did not stop within 45 s of SIGTERM (killed)")
            server.kill()
            server.wait()
    log.close()

    # ---- summary ----
    ok_total = stats.ok
    fails = stats.failures
    def bound(base):
        return max(base * args.mem_pct / 100.0, args.mem_mib * 1024)
    mem_growth = (rss_end - rss_base) if (rss_end and rss_base) else None
    rest_base = rest_end = rest_growth = None
    if mem_growth is not None and kv_base is not None and kv_end is not None:
        rest_base, rest_end = rss_base - kv_base, rss_end - kv_end
        rest_growth = rest_end - rest_base
    blocks_ok = bool(metrics and metrics["free"] is not None and metrics["free"] == metrics["total"])

    print()
    print("=" * 78)
    print("llm serve soak summary")
    print("=" * 78)
    print(f"command             {' '.join(cmd)}")
    print(f"seed                {seed}")
    print(f"clients             {args.clients} streaming, {args.hostile} hostile, {args.slow} slowloris")
    print(f"duration            {duration:.1f} s measured (+{args.warmup:g} s warm-up, {drain_s:.1f} s drain)"
          .rstrip())
    print(f"requests OK         {measured_ok} while measuring ({ok_total} in all, with warm-up and drain)")
    print(f"failed requests     {len(fails)} well-formed requests failed")
    for when, what in fails[:10]:
        print(f"    {when} {what}")
    if len(fails) > 10:
        print(f"    ... and {len(fails) - 10} more")
    if hung:
        print(f"hung client threads {len(hung)}: {', '.join(hung[:8])}")
    print(f"disconnects         {stats.disconnects} mid-stream hang-ups ({measured_disc} while measuring; "
          f"{stats.disconnect_done_first} more streams ended before their hang-up point)")
    n_host = sum(sum(d.values()) for d in stats.hostile.values())
    print(f"hostile requests    {n_host}, answered:")
    by_outcome = {}
    for d in stats.hostile.values():
        for k, v in d.items():
            by_outcome[k] = by_outcome.get(k, 0) + v
    for k in sorted(by_outcome):
        print(f"    {k:<28} {by_outcome[k]}")
    for name in sorted(stats.hostile):
        d = stats.hostile[name]
        print(f"      {name:<26} " + ", ".join(f"{k} x{v}" for k, v in sorted(d.items())))
    for f in stats.hostile_failures[:10]:
        print(f"    FAILED {f}")
    n_slow = sum(stats.slow.values())
    cut = stats.slow_cut_after
    print(f"slowloris           {n_slow}: " + ", ".join(f"{k} x{v}" for k, v in sorted(stats.slow.items()))
          + (f"; cut off after {min(cut):.1f}..{max(cut):.1f} s (request timeout {args.request_timeout:g} s)"
             if cut else ""))
    for f in stats.slow_failures[:10]:
        print(f"    FAILED {f}")
    print(f"tokens streamed     {measured_events} text events while measuring, "
          f"{measured_events / duration:.0f} tokens/s" if duration > 0 else "")
    print(f"                    ({stats.usage_tokens} completion tokens in usage chunks, all phases)")
    print(f"requests/s          {measured_ok / duration:.1f}" if duration > 0 else "")
    print(f"TTFT                p50 {percentile(stats.ttft, 50) * 1000:.0f} ms, "
          f"p99 {percentile(stats.ttft, 99) * 1000:.0f} ms ({len(stats.ttft)} requests)")
    print(f"e2e                 p50 {percentile(stats.e2e, 50) * 1000:.0f} ms, "
          f"p99 {percentile(stats.e2e, 99) * 1000:.0f} ms")
    if metrics:
        print(f"KV blocks           {metrics['free']:.0f} free of {metrics['total']:.0f} at the end "
              f"({'all back' if blocks_ok else 'NOT all back'}); running {metrics['running']:.0f}, "
              f"waiting {metrics['waiting']:.0f}")
        print("server finished     " + ", ".join(f"{k} {v}" for k, v in metrics["success"].items())
              + (f"; {metrics['preemptions']:.0f} preemptions" if metrics["preemptions"] is not None else ""))
    else:
        print("KV blocks           unknown (no /metrics)")
    if rss_base and rss_end:
        peak = max(rss_samples) if rss_samples else rss_end
        print(f"VmRSS               baseline {rss_base / 1024:.1f} MiB, end {rss_end / 1024:.1f} MiB "
              f"({mem_growth / 1024:+.1f} MiB, {100.0 * mem_growth / rss_base:+.1f}%; "
              f"bound +{bound(rss_base) / 1024:.1f} MiB), peak while measuring {peak / 1024:.1f} MiB")
        if rest_growth is not None:
            print(f"  KV pool mapping   baseline {kv_base / 1024:.1f} MiB, end {kv_end / 1024:.1f} MiB "
                  f"({(kv_end - kv_base) / 1024:+.1f} MiB: pool pages touched for the first time)")
            print(f"  everything else   baseline {rest_base / 1024:.1f} MiB, end {rest_end / 1024:.1f} MiB "
                  f"({rest_growth / 1024:+.1f} MiB, {100.0 * rest_growth / max(rest_base, 1):+.1f}%; "
                  f"bound +{bound(rest_base) / 1024:.1f} MiB)")
    else:
        print(f"VmRSS               baseline {rss_base} KiB, end {rss_end} KiB")
    print(f"/health             {health}")
    print(f"server exit status  {exit_status if exit_status is not None else crashed}")

    if fails:
        problems.append(f"{len(fails)} well-formed requests failed")
    if hung:
        problems.append(f"{len(hung)} client threads did not finish within the drain")
    if stats.hostile_failures:
        problems.append(f"{len(stats.hostile_failures)} hostile requests were answered wrongly")
    if stats.slow_failures:
        problems.append(f"{len(stats.slow_failures)} slowloris clients were not cut off right")
    if metrics and not blocks_ok:
        problems.append(f"KV blocks not all back: {metrics['free']:.0f} free of {metrics['total']:.0f}")
    warnings = []
    if mem_growth is not None and mem_growth > bound(rss_base):
        what = (f"VmRSS grew {mem_growth / 1024:.1f} MiB (bound {bound(rss_base) / 1024:.1f} MiB)"
                + (f", {(kv_end - kv_base) / 1024:.1f} MiB of it in the KV pool mapping"
                   if rest_growth is not None else ""))
        if args.mem_check == "total" or rest_growth is None:
            problems.append(what)
        else:
            warnings.append(what + " (not a failure with --mem-check rest)")
    if args.mem_check == "rest" and rest_growth is not None and rest_growth > bound(rest_base):
        problems.append(f"VmRSS outside the KV pool grew {rest_growth / 1024:.1f} MiB "
                        f"(bound {bound(rest_base) / 1024:.1f} MiB)")
    if rss_base is None or (rss_end is None and crashed is None):
        problems.append("could not read VmRSS")
    if health is not None and health != 200:
        problems.append(f"/health answered {health}")
    if exit_status not in (None, 0):
        problems.append(f"the server exited with status {exit_status} after SIGTERM")
    print("-" * 78)
    for w in warnings:
        print(f"WARNING: {w}")
    if problems:
        print("RESULT: FAIL")
        for p in problems:
            print(f"  - {p}")
        print(f"server log tail ({log_path}):")
        print(log_tail(log_path))
        return 1
    print("RESULT: PASS")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
