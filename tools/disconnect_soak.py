#!/usr/bin/env python3
"""disconnect_soak.py - llm serve under load with clients that hang up mid-stream (a soak, not a test).

Starts `llm serve` on stories260K on a loopback port, then runs ROUNDS rounds of CLIENTS streaming completions
at once; a share of them (--hangup, 0.3) close their socket after the first event. Every stream read to its end
is checked byte for byte as HTTP/1.1 chunked SSE: each chunk's size, each event JSON with the request's id,
finish_reason "length" on the last, `data: [DONE]`, the terminating chunk. After each round /metrics must show
every KV block free. Last, 64 streams are started, the server gets SIGTERM, and each must still end whole, and the
server exit 0 (draining). Prints one line a round and a summary; exit status 0 when nothing was malformed.

    python3 tools/disconnect_soak.py [--llm ./llm] [--model testdata/models/stories260K.gguf]
                                     [--rounds 7] [--clients 1024] [--hangup 0.3] [--seed 1]
"""
import argparse
import asyncio
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_chunked(body):
    """The data of a chunked body, or None when its framing is broken or it does not end."""
    out, at = [], 0
    while True:
        eol = body.find(b"\r\n", at)
        if eol < 0:
            return None
        try:
            size = int(body[at:eol], 16)
        except ValueError:
            return None
        at = eol + 2
        if size == 0:
            return b"".join(out) if body[at:] == b"\r\n" else None
        if body[at + size:at + size + 2] != b"\r\n":
            return None
        out.append(body[at:at + size])
        at += size + 2


def check_stream(raw, max_tokens):
    """None when raw is a whole, well-formed SSE completion stream; else what is wrong."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.1 200 OK\r\n") or b"Transfer-Encoding: chunked" not in head:
        return "head: %r" % head[:200]
    m = re.search(rb"X-Request-Id: ([0-9a-f]{32})\r\n", head)
    data = parse_chunked(body)
    if not m or data is None:
        return "framing: %r" % body[-200:]
    events = data.split(b"\n\n")
    if events[-1] != b"" or events[-2] != b"data: [DONE]":
        return "no [DONE] at the end: %r" % data[-200:]
    finish, tokens = None, 0
    for ev in events[:-2]:
        if not ev.startswith(b"data: "):
            return "event %r" % ev[:100]
        j = json.loads(ev[6:])
        if j.get("id") != "cmpl-" + m.group(1).decode():
            return "id %r" % j.get("id")
        c = j["choices"][0]
        if finish is not None:
            return "an event after the finish"
        finish = c.get("finish_reason")
        tokens += c["text"] != ""
    if finish != "length":
        return "finish %r" % finish
    return None


async def one_client(port, body, hangup, max_tokens):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    req = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
           "Content-Length: %d\r\n\r\n" % len(body)).encode() + body
    writer.write(req)
    await writer.drain()
    if hangup:
        await reader.read(1)  # the stream has begun
        writer.transport.abort()
        return "hung up"
    raw = await reader.read()
    writer.close()
    problem = check_stream(raw, max_tokens)
    return problem or "ok"


async def http_get(port, path):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
    raw = await reader.read()
    writer.close()
    return raw.decode(errors="replace")


def metric(text, name):
    m = re.search(r"\n%s\{[^}]*\} ([0-9.e+]+)" % re.escape(name), text)
    return float(m.group(1)) if m else None


async def blocks_back(port, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        m = await http_get(port, "/metrics")
        free, total = metric(m, "llm:kv_cache_free_blocks"), metric(m, "llm:kv_cache_blocks")
        if free is not None and free == total:
            return True, free, total
        await asyncio.sleep(0.05)
    return False, free, total


async def main_async(a, port, proc):
    rng = random.Random(a.seed)
    prompts = ["Once upon a time", "The cat", "Lily and Ben", "One day", "There was a little girl"]
    malformed = total = hung = 0
    for rnd in range(a.rounds):
        tasks = []
        for i in range(a.clients):
            mt = rng.randint(4, 32)
            body = json.dumps({"prompt": rng.choice(prompts), "max_tokens": mt, "temperature": 0.8,
                               "seed": rng.randint(0, 1 << 30), "ignore_eos": True, "stream": True}).encode()
            tasks.append(one_client(port, body, rng.random() < a.hangup, mt))
        t0 = time.time()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        bad = [r for r in results if r not in ("ok", "hung up")]
        malformed += len(bad)
        total += len(results)
        hung += sum(r == "hung up" for r in results)
        ok, free, blocks = await blocks_back(port)
        print("round %d: %d clients (%d hung up) in %.1f s, %d malformed%s; KV blocks %s of %s free" %
              (rnd + 1, len(results), sum(r == "hung up" for r in results), time.time() - t0, len(bad),
               (": " + str(bad[0])[:200]) if bad else "", free, blocks), flush=True)
        if not ok:
            malformed += 1
    # draining: 64 streams in flight, then SIGTERM: each ends whole
    tasks = [asyncio.ensure_future(one_client(port, json.dumps(
        {"prompt": "Once", "max_tokens": 200, "ignore_eos": True, "stream": True}).encode(), False, 200))
        for _ in range(64)]
    await asyncio.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    drained = sum(r == "ok" for r in results)
    rc = proc.wait(timeout=60)
    print("SIGTERM with 64 streams in flight: %d of 64 ended whole, exit status %d" % (drained, rc))
    print("summary: %d streaming clients, %d hung up mid-stream, %d malformed outputs" % (total, hung, malformed))
    return 0 if malformed == 0 and drained == 64 and rc == 0 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llm", default=os.path.join(ROOT, "llm"))
    ap.add_argument("--model", default=os.path.join(ROOT, "testdata", "models", "stories260K.gguf"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--clients", type=int, default=1024)
    ap.add_argument("--hangup", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4 * a.clients + 256)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    log = open("/tmp/disconnect_soak_serve.log", "w")
    proc = subprocess.Popen([a.llm, "serve", "-m", a.model, "--port", "0", "--max-queue", str(4 * a.clients)],
                            stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        log.write(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if not port:
        print("the server did not start")
        return 1

    def drain_log():
        for line in proc.stderr:
            log.write(line)
    import threading
    threading.Thread(target=drain_log, daemon=True).start()
    return asyncio.run(main_async(a, port, proc))


if __name__ == "__main__":
    sys.exit(main())
