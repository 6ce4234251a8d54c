#!/usr/bin/env python3
"""Three `llm serve` replicas behind HAProxy with the shipped deploy/haproxy.cfg, \
on loopback: the cluster test
(make test-cluster) and the figure that shows what prefix affinity pays (--figure).

    python3 tools/cluster_test.py                          # the test: named steps, then "N passed, M failed"
    python3 tools/cluster_test.py --figure --log results/X.log -m models/SmolLM2-135M-Instruct.Q4_1.gguf

The test (stories260K, one thread per replica):
  affinity    30 conversations x 4 turns, one request at a time: every turn of a conversation on one replica,
              no replica above 1.5x the mean, the replicas' prefix caches hit; an X-Session-Id header wins
              over the body; /v1/completions keys on the first 2 KiB of the prompt
  cache key   8 conversations with one first message, a prompt_cache_key each: each on one replica, more
              than one replica used, cached_tokens > 0 from the second turn; /v1/completions keys on it too;
              X-Session-Id wins over it
  other APIs  /v1/messages and /v1/responses: 6 conversations x 3 turns each, each on one replica, more than
              one replica used, the prefix cache hits; two compacted (/v1/responses/compact) on their
              replica, cached; stored responses chained by previous_response_id with a prompt_cache_key
              each find their parent
  headers     X-Request-Id (the client's, else one minted) and X-Served-By on answers, streamed or not; the
              completion's id names the request id; usage.prompt_tokens_details.cached_tokens on a second
              turn, streamed (include_usage) or not
  smuggling   a chunked body whose first chunk holds "0", an empty line and a whole request, sent in two
              parts (HAProxy forwards the first 256 KiB as a chunk alone): one response, the outer request's
              400 for its whole body, and no replica runs the request inside (issue 50: one did, decoding the
              body again in place after the split)
  sigkill     streaming load, one replica SIGKILLed: the only failures are streams in flight on it, every
              other request completes; the next turn moves its conversations and no other; restarted, it
              gets them back
  sigterm     streams in flight on a replica, then SIGTERM: /health there answers 503 while they finish,
              they all finish, the new turns meanwhile go elsewhere and none fails, the replica exits 0

Affinity is measured one request at a time on purpose: the shipped config bounds each replica's share of the
requests in flight (hash-balance-factor 150), and under a burst a request past that bound goes to the next
replica on the ring; the test checks where the hash sends conversations, the figure what that pays under load.

The figure runs one multi-turn workload, `llm bench serve --multi-turn` (a shared system prompt, each user's
history growing, answers appended), twice through HAProxy, with `balance roundrobin`
(LLM_LB_BALANCE=roundrobin) and with the shipped prefix-affinity config, on fresh replicas each time: the
bench's prefix-cache hit rate (from the replicas' /metrics before and after) and TTFT p50/p90 of rounds 2+.
Timings belong to the figure, never to the test.

Everything it starts (replicas, HAProxy) is stopped when it ends, and dies with it if it is killed (parent-
death signal); every request has a time-out and the whole run a deadline (--deadline). Loopback only.
Standard library only (and the llm binary: its bench drives the figure).
"""
import argparse
import ctypes
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = os.path.join(ROOT, "deploy", "haproxy.cfg")
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
N_REPLICAS = 3
NAMES = ["replica%d" % (i + 1) for i in range(N_REPLICAS)]
HAPROXY = [shutil.which("haproxy") or "/usr/sbin/haproxy"]  # --haproxy sets it

_children = []  # every process started, stopped in stop_all()


def _die_with_parent():
    # PR_SET_PDEATHSIG: a replica or HAProxy must not outlive this script, even when it is SIGKILLed
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def start(args, env, log_path):
    log = open(log_path, "ab")
    p = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         cwd=ROOT, preexec_fn=_die_with_parent)
    log.close()
    _children.append(p)
    return p


def stop(p, sig=signal.SIGTERM, wait=10):
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def stop_all():
    for p in _children:
        if p.poll() is None:
            stop(p)


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


# ---- HTTP -------------------------------------------------------------------------------------------------
class Reply:
    """One request's outcome: status, headers (lower-case names), body or stream, timings, error."""
    def __init__(self):
        self.status, self.headers, self.body, self.error = None, {}, None, None
        self.chunks, self.text, self.done, self.usage = [], "", False, None
        self.t_start = self.t_headers = self.t_first = self.t_end = None

    @property
    def served_by(self):
        return self.headers.get("x-served-by")

    @property
    def ok(self):
        return self.error is None and self.status == 200 and (self.body is not None or self.done)


def post(port, path, body, headers=None, timeout=60, on_headers=None):
    """POST JSON; a streaming body ("stream": true) is read event by event to data: [DONE]."""
    r = Reply()
    r.t_start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request("POST", path, json.dumps(body), h)
        resp = conn.getresponse()
        r.t_headers = time.monotonic()
        r.status = resp.status
        r.headers = {k.lower(): v for k, v in resp.getheaders()}
        if on_headers:
            on_headers(r)
        if not body.get("stream") or resp.status != 200:
            raw = resp.read()
            r.body = json.loads(raw) if raw else None
        else:
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    r.done = True
                    break
                ev = json.loads(data)
                r.chunks.append(ev)
                if ev.get("usage"):
                    r.usage = ev["usage"]
                for ch in ev.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                    if piece and r.t_first is None:
                        r.t_first = time.monotonic()
                    r.text += piece
            if r.done:
                resp.read()  # the chunked terminator
    except Exception as e:  # a refused connection, a stream cut short, a time-out: the request failed
        r.error = "%s: %s" % (type(e).__name__, e)
    finally:
        conn.close()
        r.t_end = time.monotonic()
    return r


def get(port, path, timeout=5):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    except OSError as e:
        return None, "%s: %s" % (type(e).__name__, e)
    finally:
        conn.close()


def answer_of(r):
    if r.body is not None:
        return r.body["choices"][0]["message"]["content"] or ""
    return r.text


def prefix_counters(port):
    """(hits, queries) from a replica's /metrics: vllm:prefix_cache_{hits,queries}, with or without _total."""
    status, text = get(port, "/metrics")
    if status != 200:
        raise RuntimeError("GET /metrics on port %d: %s" % (port, status))
    vals = {}
    for m in re.finditer(r"^vllm:prefix_cache_(hits|queries)(?:_total)?(?:\{[^}]*\})? ([0-9.e+]+)$", text,
                         re.M):
        vals[m.group(1)] = vals.get(m.group(1), 0) + float(m.group(2))
    return vals.get("hits", 0.0), vals.get("queries", 0.0)


# ---- the cluster ------------------------------------------------------------------------------------------
class Cluster:
    def __init__(self, llm, model, workdir, balance=None, serve_args=()):
        self.llm, self.model, self.dir, self.serve_args = llm, model, workdir, list(serve_args)
        ports = free_ports(N_REPLICAS + 2)
        self.lb, self.stats, self.ports = ports[0], ports[1], ports[2:]
        self.procs = [None] * N_REPLICAS
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        self.ha_env = dict(os.environ, LLM_LB_BIND="127.0.0.1:%d" % self.lb,
                           LLM_LB_STATS_BIND="127.0.0.1:%d" % self.stats)
        for i, p in enumerate(self.ports):
            self.ha_env["LLM_REPLICA%d" % (i + 1)] = "127.0.0.1:%d" % p
        if balance:
            self.ha_env["LLM_LB_BALANCE"] = balance
        self.haproxy = None

    def start_replica(self, i):
        args = [self.llm, "serve", "-m", self.model, "--port", str(self.ports[i])] + self.serve_args
        self.procs[i] = start(args, self.env, os.path.join(self.dir, "%s.log" % NAMES[i]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                raise RuntimeError("%s exited with %s (log: %s/%s.log)" % (NAMES[i], self.procs[i].returncode,
                                                                          self.dir, NAMES[i]))
            if get(self.ports[i], "/health", timeout=2)[0] == 200:
                return
            time.sleep(0.1)
        raise RuntimeError("%s did not answer /health within 60 s" % NAMES[i])

    def start(self):
        for i in range(N_REPLICAS):
            self.start_replica(i)
        ha = HAPROXY[0]
        # -db: in the foreground, not daemonized, so this script owns it and its log
        self.haproxy = start([ha, "-db", "-f", CFG], self.ha_env, os.path.join(self.dir, "haproxy.log"))
        self.wait_states({n: "UP" for n in NAMES})

    def server_states(self):
        status, text = get(self.stats, "/stats;csv")
        if status != 200:
            return {}
        states = {}
        for line in text.splitlines():
            f = line.split(",")
            if len(f) > 17 and f[0] == "replicas" and f[1] in NAMES:
                states[f[1]] = f[17].split()[0]  # "UP", "DOWN", "UP 1/2", "NOLB", ...
        return states

    def wait_states(self, want, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.haproxy.poll() is not None:
                raise RuntimeError("haproxy exited with %s (log: %s/haproxy.log)" % (self.haproxy.returncode,
                                                                                      self.dir))
            st = self.server_states()
            if all(st.get(n) == s for n, s in want.items()):
                return
            time.sleep(0.2)
        raise RuntimeError("HAProxy's servers are %s after %d s, not %s"
                           % (self.server_states(), timeout, want))

    def stop(self):
        if self.haproxy:
            stop(self.haproxy)
        for p in self.procs:
            if p:
                stop(p)


# ---- conversations ----------------------------------------------------------------------------------------
WORDS = ("cat dog bird tree boat hill river cake ball star moon rain sun king frog fish bear girl boy "
         "garden forest castle ship lamp book road bell apple flower cloud wind snow").split()

SYSTEM_TEST = ("You are a kind storyteller. You tell short, happy stories for small children, with simple "
               "words, a friendly animal, and a good ending.")


class Conversation:
    def __init__(self, cid, system, first, rng, words_per_turn=8):
        self.cid, self.rng, self.wpt = cid, rng, words_per_turn
        self.messages = [{"role": "system", "content": system}] if system else []
        self.messages.append({"role": "user", "content": first})
        self.replicas = []

    def request(self, max_tokens, stream=False, **extra):
        body = {"messages": self.messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        body.update(extra)
        return body

    def answered(self, text):
        self.messages.append({"role": "assistant", "content": text})
        more = " ".join(self.rng.choice(WORDS) for _ in range(self.wpt))
        self.messages.append({"role": "user", "content": "And then? Tell me about the %s." % more})


def make_conversations(n, system, seed, first_words=6, words_per_turn=8):
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        first = "Story %d: once upon a time, a %s." % (i, " ".join(rng.choice(WORDS)
                                                                  for _ in range(first_words)))
        convs.append(Conversation(i, system, first, random.Random(seed * 1000 + i), words_per_turn))
    return convs


# ---- the test ---------------------------------------------------------------------------------------------
class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, step, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print("%s: %s: %s%s" % ("PASS" if ok else "FAIL", step, name, (" (%s)" % detail) if detail else ""),
              flush=True)
        return ok


def turn(cl, conv, max_tokens=8):
    r = post(cl.lb, CHAT, conv.request(max_tokens))
    if r.ok:
        conv.answered(answer_of(r))
    conv.replicas.append(r.served_by if r.ok else None)
    return r


def session_ids_by_replica(cl, n=24):
    """Which replica the shipped hash sends each of n X-Session-Id values to: how the load steps aim."""
    where = {name: [] for name in NAMES}
    for k in range(n):
        sid = "load-session-%d" % k
        r = post(cl.lb, COMP, {"prompt": "Once", "max_tokens": 1}, {"X-Session-Id": sid})
        if r.ok and r.served_by in where:
            where[r.served_by].append(sid)
    return where


def step_affinity(C, cl, convs):
    S = "affinity"
    before = [prefix_counters(p) for p in cl.ports]
    errors = []
    for t in range(4):
        for conv in convs:
            r = turn(cl, conv)
            if not r.ok:
                errors.append("conversation %d turn %d: %s %s" % (conv.cid, t + 1, r.status, r.error))
    C.check(S, "120 turns (30 conversations x 4) answered 200 through HAProxy", not errors,
            "; ".join(errors[:3]))
    split = [c.cid for c in convs if len(set(c.replicas)) != 1]
    C.check(S, "no conversation split across replicas", not split, "split: %s" % split[:10])
    count = {n: 0 for n in NAMES}
    for c in convs:
        if c.replicas[0] in count:
            count[c.replicas[0]] += 1
    mean = len(convs) / N_REPLICAS
    C.check(S, "no replica above 1.5x the mean of %.0f conversations" % mean,
            max(count.values()) <= 1.5 * mean, "conversations per replica: %s" % count)
    after = [prefix_counters(p) for p in cl.ports]
    hits = sum(a[0] - b[0] for a, b in zip(after, before))
    queries = sum(a[1] - b[1] for a, b in zip(after, before))
    C.check(S, "the replicas' prefix caches hit on later turns (vllm:prefix_cache_hits)",
            queries > 0 and hits / queries > 0.5, "hit rate %.2f" % (hits / queries if queries else 0))
    # X-Session-Id wins over the body: one id, different conversations, one replica
    seen = set()
    for k in range(6):
        r = post(cl.lb, CHAT, {"messages": [{"role": "user", "content": "Hello number %d" % k}],
                               "max_tokens": 2},
                 {"X-Session-Id": "one-session"})
        seen.add(r.served_by if r.ok else "error %s %s" % (r.status, r.error))
    C.check(S, "an X-Session-Id header wins: 6 different first messages, one session, one replica",
            len(seen) == 1 and seen <= set(NAMES), "served by %s" % sorted(seen))
    # completions: a prompt continued past its first 2 KiB keeps its replica; different prompts spread
    base = "Once upon a time there was a little girl named Lily. " * 50
    seen = set()
    for k in range(5):
        r = post(cl.lb, COMP, {"prompt": base[:2048] + " Then %s." % WORDS[k] * (k + 1), "max_tokens": 2})
        seen.add(r.served_by if r.ok else "error %s %s" % (r.status, r.error))
    C.check(S, "/v1/completions: prompts with the same first 2 KiB go to one replica",
            len(seen) == 1 and seen <= set(NAMES), "served by %s" % sorted(seen))
    spread = set()
    for k in range(12):
        r = post(cl.lb, COMP, {"prompt": "Story %d: %s" % (k, base), "max_tokens": 2})
        spread.add(r.served_by if r.ok else "error")
    C.check(S, "/v1/completions: 12 different prompts spread over more than one replica",
            len(spread - {"error"}) > 1 and "error" not in spread, "served by %s" % sorted(spread))


def step_cache_key(C, cl):
    S = "cache key"
    # 8 conversations with one system prompt and one first message, which the content rules would send to
    # one replica: a distinct prompt_cache_key each spreads them, and keeps each where its prefix is cached
    convs = make_conversations(8, SYSTEM_TEST, seed=11)
    for c in convs:
        c.messages[1]["content"] = "Story: once upon a time, a cat and a dog."
    errors, uncached = [], []
    for t in range(3):
        for c in convs:
            r = post(cl.lb, CHAT, c.request(6, prompt_cache_key="conversation-%d" % c.cid))
            c.replicas.append(r.served_by if r.ok else None)
            if not r.ok:
                errors.append("conversation %d turn %d: %s %s" % (c.cid, t + 1, r.status, r.error))
                continue
            c.answered(answer_of(r))
            u = r.body.get("usage") or {}
            if t > 0 and not (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) > 0:
                uncached.append("conversation %d turn %d: usage %s" % (c.cid, t + 1, u))
    C.check(S, "24 turns (8 conversations x 3, one prompt_cache_key each) answered 200", not errors,
            "; ".join(errors[:3]))
    where = {"conversation-%d" % c.cid: c.replicas for c in convs}
    C.check(S, "X-Served-By constant per prompt_cache_key", all(len(set(w)) == 1 for w in where.values()),
            "served by %s" % where)
    used = {w[0] for w in where.values()}
    C.check(S, "8 prompt_cache_keys, same messages: more than one replica used", len(used) > 1 and
            used <= set(NAMES), "served by %s" % sorted(map(str, used)))
    C.check(S, "turns 2 and 3 report cached_tokens > 0 (llm serve)", not uncached, "; ".join(uncached[:3]))
    # /v1/completions: one prompt, 8 keys: spread the same way, each key to its conversation's replica
    comp = {}
    for k in range(8):
        r = post(cl.lb, COMP, {"prompt": "Once upon a time", "max_tokens": 1,
                               "prompt_cache_key": "conversation-%d" % k})
        comp["conversation-%d" % k] = r.served_by if r.ok else "error %s %s" % (r.status, r.error)
    C.check(S, "/v1/completions: each prompt_cache_key goes where its chat went",
            all(comp[k] == w[0] for k, w in where.items()), "completions %s" % comp)
    # X-Session-Id wins over prompt_cache_key: one session, 8 keys, one replica
    seen = set()
    for k in range(8):
        r = post(cl.lb, COMP, {"prompt": "Once", "max_tokens": 1, "prompt_cache_key": "conversation-%d" % k},
                 {"X-Session-Id": "one-session"})
        seen.add(r.served_by if r.ok else "error %s %s" % (r.status, r.error))
    C.check(S, "an X-Session-Id header wins over prompt_cache_key: 8 keys, one session, one replica",
            len(seen) == 1 and seen <= set(NAMES), "served by %s" % sorted(seen))


def step_other_apis(C, cl):
    S = "other APIs"
    # Anthropic's /v1/messages and the Responses API keep a conversation on one replica too (its first
    # message, or input, is the key), spread conversations over the replicas, and the prefix cache hits;
    # a Responses conversation continued by previous_response_id with a prompt_cache_key finds its parent
    errors, where, uncached, histories = [], {}, [], {}
    for api in ("messages", "responses"):
        for k in range(6):
            rng = random.Random(100 + k)
            first = "Story %d: %s." % (k, " ".join(rng.choice(WORDS) for _ in range(8)))
            turns = [first, "And then?", "What happened next?"]
            history, served = [], []
            for t, text in enumerate(turns):
                history.append({"role": "user", "content": text})
                if api == "messages":
                    r = post(cl.lb, "/v1/messages", {"max_tokens": 6, "temperature": 0, "messages": history})
                    reply = "".join(b.get("text", "") for b in (r.body or {}).get("content", []))
                    cached = ((r.body or {}).get("usage") or {}).get("cache_read_input_tokens", 0)
                else:
                    r = post(cl.lb, "/v1/responses", {"max_output_tokens": 6, "temperature": 0,
                                                      "input": history if t else text})
                    reply = "".join(c.get("text", "") for o in (r.body or {}).get("output", [])
                                    for c in o.get("content", []))
                    cached = (((r.body or {}).get("usage") or {}).get("input_tokens_details") or {}).get(
                        "cached_tokens", 0)
                served.append(r.served_by if r.ok else None)
                if not r.ok:
                    errors.append("%s %d turn %d: %s %s" % (api, k, t + 1, r.status, r.error))
                    break
                if t and not cached > 0:
                    uncached.append("%s %d turn %d" % (api, k, t + 1))
                history.append({"role": "assistant", "content": reply or "..."})
            where["%s-%d" % (api, k)] = served
            histories["%s-%d" % (api, k)] = history
    C.check(S, "36 turns (6 conversations x 3 on /v1/messages and on /v1/responses) answered 200", not errors,
            "; ".join(errors[:3]))
    C.check(S, "X-Served-By constant per conversation", all(len(set(w)) == 1 for w in where.values()),
            "served by %s" % where)
    for api in ("messages", "responses"):
        used = {w[0] for k, w in where.items() if k.startswith(api)}
        C.check(S, "/v1/%s: 6 conversations on more than one replica" % api, len(used) > 1 and
                used <= set(NAMES), "served by %s" % sorted(map(str, used)))
    C.check(S, "turns 2 and 3 report cached tokens > 0 (llm serve)", not uncached, "; ".join(uncached[:4]))
    # a conversation compacted (POST /v1/responses/compact, as Codex does when its context fills) goes to
    # the replica that holds it, and its prompt is cached there
    compacted = []
    for k in range(2):
        key = "responses-%d" % k
        r = post(cl.lb, "/v1/responses/compact", {"input": histories[key]})
        usage = (r.body or {}).get("usage") or {}
        out = (r.body or {}).get("output") or [{}]
        compacted.append((r.status, r.served_by, where[key][0], out[-1].get("type"),
                          (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)))
    C.check(S, "2 conversations compacted on their replica, their prompts cached",
            all(st == 200 and by == home and t == "compaction" and c > 0 for st, by, home, t, c in compacted),
            "(status, served by, conversation's replica, last item, cached tokens): %s" % compacted)
    # stored responses continued by previous_response_id: the prompt_cache_key sends each turn to the
    # replica whose store holds the one before
    ids, bad = {}, []
    for k in range(6):
        prev = None
        for t in range(3):
            body = {"max_output_tokens": 4, "temperature": 0, "prompt_cache_key": "chain-%d" % k,
                    "input": "Chain %d, turn %d: go on." % (k, t)}
            if prev:
                body["previous_response_id"] = prev
            r = post(cl.lb, "/v1/responses", body)
            if not r.ok:
                bad.append("chain %d turn %d: %s %s" % (k, t + 1, r.status, (r.body or r.error)))
                break
            prev = r.body.get("id")
            ids.setdefault(k, set()).add(r.served_by)
    C.check(S, "6 chains of 3 responses by previous_response_id, each with its prompt_cache_key: all found "
            "their parent", not bad and all(len(v) == 1 for v in ids.values()), "; ".join(map(str, bad[:3])))


def step_headers(C, cl):
    S = "headers"
    rid = "cluster-test-request-42"
    r = post(cl.lb, CHAT, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
             {"X-Request-Id": rid})
    C.check(S, "a client's X-Request-Id comes back on the answer",
            r.ok and r.headers.get("x-request-id") == rid,
            "status %s, X-Request-Id %r" % (r.status, r.headers.get("x-request-id")))
    C.check(S, "X-Served-By names the replica", r.served_by in NAMES, "X-Served-By %r" % r.served_by)
    rid_in_id = r.ok and rid in str((r.body or {}).get("id"))
    C.check(S, "the completion's id names the X-Request-Id (llm serve)", rid_in_id,
            "id %r" % (r.body or {}).get("id"))
    r = post(cl.lb, COMP, {"prompt": "Once upon", "max_tokens": 3})
    minted = r.headers.get("x-request-id") or ""
    C.check(S, "without one, an X-Request-Id is minted and returned", r.ok and len(minted) >= 16,
            "X-Request-Id %r" % minted)
    C.check(S, "the minted X-Request-Id names the completion (llm serve)",
            r.ok and bool(minted) and minted in str((r.body or {}).get("id")),
            "id %r" % (r.body or {}).get("id"))
    r = post(cl.lb, CHAT, {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 4,
                           "stream": True}, {"X-Request-Id": rid + "-stream"})
    C.check(S, "a streamed answer carries X-Request-Id and X-Served-By, and ends with [DONE]",
            r.ok and r.headers.get("x-request-id") == rid + "-stream" and r.served_by in NAMES,
            "status %s, error %s, headers %s" % (r.status, r.error, r.headers))
    C.check(S, "every streamed chunk's id names the X-Request-Id (llm serve)",
            r.ok and bool(r.chunks) and all(rid + "-stream" in str(ch.get("id")) for ch in r.chunks),
            "ids %s" % sorted({str(ch.get("id")) for ch in r.chunks})[:3])
    # cached_tokens: the second turn of a conversation finds the first in its replica's prefix cache
    conv = make_conversations(1, SYSTEM_TEST, seed=7)[0]
    turn(cl, conv)
    r = post(cl.lb, CHAT, conv.request(4))
    u = (r.body or {}).get("usage") or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    C.check(S, "usage.prompt_tokens_details.cached_tokens > 0 on a second turn (llm serve)",
            r.ok and isinstance(cached, int) and 0 < cached <= u.get("prompt_tokens", 0), "usage %s" % u)
    r = post(cl.lb, CHAT, conv.request(4, stream=True, stream_options={"include_usage": True}))
    u = r.usage or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    C.check(S, "streamed with include_usage: cached_tokens > 0 too (llm serve)",
            r.ok and isinstance(cached, int) and 0 < cached <= u.get("prompt_tokens", 0), "usage %s" % u)


def step_smuggling(C, cl):
    S = "smuggling"
    before = [success_counts(p) for p in cl.ports]
    inner_body = b'{"prompt":"smuggled","max_tokens":1}'
    inner = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"X-Request-Id: smuggled-1\r\nContent-Length: %d\r\n\r\n" % len(inner_body)) + inner_body
    first = b"0\r\n\r\n" + inner
    first += b"x" * (300000 - len(first))  # past HAProxy's buffer (tune.bufsize): forwarded as a chunk alone
    second = b"y" * 1000
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    resp = b""
    s = socket.create_connection(("127.0.0.1", cl.lb), timeout=10)
    try:
        s.sendall(head + b"%x\r\n" % len(first) + first + b"\r\n")
        time.sleep(0.5)
        s.sendall(b"%x\r\n" % len(second) + second + b"\r\n0\r\n\r\n")
        s.settimeout(3)  # kept alive: what comes within 3 s
        while True:
            k = s.recv(65536)
            if not k:
                break
            resp += k
    except socket.timeout:
        pass
    finally:
        s.close()
    time.sleep(0.5)
    after = [success_counts(p) for p in cl.ports]
    ran = [n for n in NAMES if b"smuggled-1" in open(os.path.join(cl.dir, "%s.log" % n), "rb").read()]
    statuses = re.findall(rb"HTTP/1\.1 (\d{3})", resp)
    C.check(S, "one response, the outer request's, its body the chunks' data (400: \"0\", then more text)",
            statuses == [b"400"] and b"not valid JSON: more text after the value at byte 5" in resp,
            "%r" % resp[:400])
    C.check(S, "no replica ran the request inside the chunk", after == before and not ran,
            "finished requests per replica %s -> %s; smuggled-1 in the log of %s" % (before, after, ran))


class Load:
    """Threads sending streaming requests, each aimed by an X-Session-Id, until stopped (bounded in count)."""
    def __init__(self, cl, sids, max_tokens, per_thread=200):
        self.cl, self.sids, self.max_tokens, self.per_thread = cl, sids, max_tokens, per_thread
        self.stop, self.replies, self.lock = threading.Event(), [], threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(s,), daemon=True) for s in sids]

    def run(self, sid):
        for k in range(self.per_thread):
            if self.stop.is_set():
                return
            body = {"prompt": "Once upon a time, %s" % sid, "max_tokens": self.max_tokens, "ignore_eos": True,
                    "stream": True, "temperature": 0.8, "seed": k}
            r = post(self.cl.lb, COMP, body, {"X-Session-Id": sid}, timeout=60)
            r.sid = sid
            with self.lock:
                self.replies.append(r)

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self, timeout=90):
        self.stop.set()
        for t in self.threads:
            t.join(timeout)


def step_sigkill(C, cl, convs, where):
    S = "sigkill"
    # the victim: the replica that most of these conversations live on, so that its moving shows
    home = {c.cid: c.replicas[0] for c in convs}
    victim = max(NAMES, key=lambda n: (sum(1 for h in home.values() if h == n), n))
    vi = NAMES.index(victim)
    # load on every replica: 3 streams aimed at each (by session ids the hash sends there)
    sids = [s for n in NAMES for s in where[n][:3]]
    if len({n for n in NAMES if where[n]}) < N_REPLICAS:
        C.check(S, "session ids reach every replica", False, "%s" % where)
        return
    load = Load(cl, sids, max_tokens=400)
    load.start()
    time.sleep(1.5)
    t_kill = time.monotonic()
    cl.procs[vi].kill()  # SIGKILL
    cl.procs[vi].wait(10)
    time.sleep(3)  # requests keep coming while HAProxy finds out (a refused connection, then its checks)
    load.finish()
    replies = load.replies

    def in_flight_on_victim(r):  # sent before the kill, not done by then, and not known to be elsewhere
        return r.t_start < t_kill <= r.t_end and r.served_by in (victim, None)
    failed = [r for r in replies if not r.ok]
    exposed = [r for r in replies if in_flight_on_victim(r)]
    C.check(S, "%s had streams in flight when it was killed" % victim, len(exposed) > 0,
            "%d requests in all" % len(replies))
    C.check(S, "failures (%d) no more than its in-flight streams (%d), and only those"
            % (len(failed), len(exposed)),
            all(in_flight_on_victim(r) for r in failed),
            "; ".join("%s %s %s" % (r.served_by, r.status, r.error) for r in failed
                      if not in_flight_on_victim(r))[:400])
    others = [r for r in replies if not in_flight_on_victim(r)]
    C.check(S, "every other request completed (%d)" % len(others),
            all(r.ok for r in others) and len(others) > 0,
            "%d failed" % sum(1 for r in others if not r.ok))
    after_kill = [r for r in replies if r.t_start > t_kill]
    C.check(S, "requests sent after the kill went to the other replicas (%d)" % len(after_kill),
            after_kill and all(r.ok and r.served_by != victim for r in after_kill))
    # the next turn of each conversation: the victim's move, no other does
    errors, moved_wrong, stayed_wrong = [], [], []
    for c in convs:
        r = turn(cl, c)
        if not r.ok:
            errors.append("%d: %s %s" % (c.cid, r.status, r.error))
        elif home[c.cid] == victim and r.served_by == victim:
            stayed_wrong.append(c.cid)
        elif home[c.cid] != victim and r.served_by != home[c.cid]:
            moved_wrong.append(c.cid)
    C.check(S, "the next turn of all 30 conversations answered", not errors, "; ".join(errors[:3]))
    n_victim = sum(1 for h in home.values() if h == victim)
    C.check(S, "only %s's %d conversations moved" % (victim, n_victim), not moved_wrong and not stayed_wrong,
            "others moved: %s; the victim's stayed: %s" % (moved_wrong, stayed_wrong))
    # restarted on its port, it comes back up in HAProxy's checks and gets its conversations back
    cl.start_replica(vi)
    cl.wait_states({n: "UP" for n in NAMES})
    back = []
    for c in convs:
        r = turn(cl, c)
        if not r.ok or r.served_by != home[c.cid]:
            back.append("%d: %s -> %s" % (c.cid, home[c.cid], r.served_by if r.ok else r.error))
    C.check(S, "restarted, %s gets its conversations back (and the rest stay)" % victim, not back,
            "; ".join(back[:5]))


def step_sigterm(C, cl, convs, where):
    S = "sigterm"
    home = {c.cid: c.replicas[0] for c in convs}
    victim = NAMES[0] if NAMES[0] != max(NAMES, key=lambda n: sum(1 for h in home.values() if h == n)) \
        else NAMES[1]
    vi = NAMES.index(victim)
    # long streams: 3 aimed at the victim, 1 at each other replica; SIGTERM once the victim's have begun (the
    # bounded load may send one of the three elsewhere: 5 in flight on 3 replicas allow 2 on each)
    sids = where[victim][:3] + [where[n][0] for n in NAMES if n != victim]
    load = Load(cl, sids, max_tokens=1800, per_thread=1)
    load.start()

    def running_on_victim():
        status, text = get(cl.ports[vi], "/metrics")
        m = re.search(r"^vllm:num_requests_running\S* (\d+)", text or "", re.M)
        return int(m.group(1)) if m else 0

    deadline, running = time.monotonic() + 30, 0
    while time.monotonic() < deadline and running < 1:
        running = running_on_victim()
        time.sleep(0.02)
    time.sleep(0.3)  # the others begin too (a stream of 1800 tokens runs for seconds)
    running = max(running, running_on_victim())
    cl.procs[vi].send_signal(signal.SIGTERM)
    C.check(S, "%s had streams running when it got SIGTERM" % victim, running > 0, "%d running" % running)
    health, _ = get(cl.ports[vi], "/health")
    C.check(S, "%s's /health answers 503 while its streams finish (llm serve)" % victim, health == 503,
            "status %s" % health)
    # new turns meanwhile: conversations living on the victim, and session ids aimed at it
    new = []
    for c in convs:
        if home[c.cid] == victim:
            new.append(turn(cl, c))
    for sid in where[victim][3:6]:
        new.append(post(cl.lb, COMP, {"prompt": "Once", "max_tokens": 4}, {"X-Session-Id": sid}))
    load.finish(timeout=300)  # within the drain timeout above
    streams = load.replies
    C.check(S, "the streams in flight (%d on %s) all finished" % (running, victim),
            len(streams) == len(sids) and all(r.ok for r in streams),
            "; ".join("%s %s %s" % (r.served_by, r.status, r.error) for r in streams if not r.ok))
    C.check(S, "%d new turns while it drained: none failed, none went to %s" % (len(new), victim),
            new and all(r.ok and r.served_by != victim for r in new),
            "; ".join("%s %s %s" % (r.served_by, r.status, r.error) for r in new
                      if not r.ok or r.served_by == victim)[:400])
    try:
        rc = cl.procs[vi].wait(60)
    except subprocess.TimeoutExpired:
        rc = "still running after 60 s"
    C.check(S, "%s exited with status 0 once its streams were done" % victim, rc == 0, "exit %s" % rc)


def run_test(a):
    C = Checks()
    work = tempfile.mkdtemp(prefix="llm-cluster-")
    # --drain-timeout 300: step sigterm checks that the streams in flight finish, not how fast: on a loaded
    # 2-core machine two 1800-token streams took over the default 30 s, and were cut short
    cl = Cluster(a.llm, a.model, work, serve_args=["--num-blocks", "4096", "--drain-timeout", "300"])
    try:
        print("cluster: 3 x llm serve (%s, 1 thread each) behind HAProxy (%s), logs in %s" %
              (os.path.basename(a.model), os.path.relpath(CFG, ROOT), work), flush=True)
        cl.start()
        convs = make_conversations(30, SYSTEM_TEST, seed=1)
        for name, fn in (("affinity", lambda: step_affinity(C, cl, convs)),
                         ("cache key", lambda: step_cache_key(C, cl)),
                         ("other APIs", lambda: step_other_apis(C, cl)),
                         ("headers", lambda: step_headers(C, cl)),
                         ("smuggling", lambda: step_smuggling(C, cl)),
                         ("sigkill", lambda: step_sigkill(C, cl, convs, session_ids_by_replica(cl))),
                         ("sigterm", lambda: step_sigterm(C, cl, convs, session_ids_by_replica(cl)))):
            try:
                fn()
            except Exception as e:  # a step that cannot go on fails as a whole; the next one still runs
                C.check(name, "the step ran to its end", False, "%s: %s" % (type(e).__name__, e))
    finally:
        cl.stop()
        stop_all()
    if C.failed:
        print("cluster: logs kept in %s" % work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (C.passed, C.failed), flush=True)
    return 1 if C.failed else 0


# ---- the figure -------------------------------------------------------------------------------------------
def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


def success_counts(port):
    """Requests a replica finished (vllm:request_success_total, all reasons), from its /metrics."""
    status, text = get(port, "/metrics")
    return sum(float(m.group(1)) for m in
               re.finditer(r"^vllm:request_success_total(?:\{[^}]*\})? ([0-9.e+]+)$", text or "", re.M))


def bench_figure(text, label):
    """A number from llm bench serve's summary: the line that starts with label."""
    m = re.search(r"^%s:?\s+([0-9.]+)" % re.escape(label), text, re.M)
    return float(m.group(1)) if m else float("nan")


def run_workload(a, balance, work, log):
    """The multi-turn workload through HAProxy, as users run it: llm bench serve --multi-turn, reading each
    replica's /metrics for the prefix cache's hits."""
    cl = Cluster(a.llm, a.model, work, balance=balance, serve_args=a.serve_args.split())
    try:
        cl.start()
        before = [success_counts(p) for p in cl.ports]
        cmd = [a.llm, "bench", "serve", "--port", str(cl.lb), "--multi-turn", "%d:%d" % (a.users, a.rounds),
               "--system-words", str(a.system_words), "--turn-words", a.turn_words,
               "--output-len", "%d:%d" % (a.max_tokens, a.max_tokens), "--seed", "5", "--timeout", "300",
               "--request-rate", str(a.join_rate)]
        for p in cl.ports:
            cmd += ["--metrics-url", "http://127.0.0.1:%d/metrics" % p]
        t0 = time.monotonic()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
        wall = time.monotonic() - t0
        after = [success_counts(p) for p in cl.ports]
    finally:
        cl.stop()
        stop_all()
    text = out.stdout
    per_replica = {n: int(x - y) for n, x, y in zip(NAMES, after, before)}
    res = {"balance": balance or "hash (shipped)",
           "cmd": " ".join(os.path.relpath(c, ROOT) if c == a.llm else c for c in cmd),
           "requests": bench_figure(text, "Successful requests"),
           "failed": bench_figure(text, "Failed requests"),
           "queries": bench_figure(text, "Prefix cache queries (tokens)"),
           "hits": bench_figure(text, "Prefix cache hits (tokens)"),
           "hit_rate": bench_figure(text, "Prefix cache hit rate"),
           "ttft_p50": bench_figure(text, "Rounds 2+ TTFT P50 (ms)") / 1000,
           "ttft_p90": bench_figure(text, "Rounds 2+ TTFT P90 (ms)") / 1000,
           "n_ttft": bench_figure(text, "Rounds 2+ requests"), "wall": wall, "per_replica": per_replica,
           "rc": out.returncode}
    res["misses"] = res["queries"] - res["hits"]
    log("  %-16s %s" % (res["balance"], res["cmd"]))
    log("  %-16s exit %d, requests %d (failed %d), finished per replica %s, wall %.1f s" %
        (res["balance"], out.returncode, res["requests"], res["failed"], per_replica, wall))
    if out.returncode != 0:
        log("  llm bench serve failed: %s" % out.stderr.strip()[-400:])
    return res


def run_figure(a):
    out = open(a.log, "w") if a.log else None

    def log(s=""):
        print(s, flush=True)
        if out:
            out.write(s + "\n")
            out.flush()
    work = tempfile.mkdtemp(prefix="llm-cluster-figure-")
    log("# prefix affinity vs round robin: 3 x llm serve behind HAProxy (%s), %s" %
        (os.path.relpath(CFG, ROOT), time.strftime("%Y-%m-%d %H:%M:%S")))
    log("# command: %s" % " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]))
    log("# model %s, replicas: llm serve %s, OMP_NUM_THREADS=1; %s" %
        (os.path.relpath(a.model, ROOT), a.serve_args, (haproxy_version() or "haproxy ?")))
    log("# machine: %d cores (%s), load average before: %s" %
        (os.cpu_count(), cpu_name(), " ".join("%.2f" % x for x in os.getloadavg())))
    log("# workload: llm bench serve --multi-turn %d:%d (users joining at %g a second, then all at once; "
        "streaming chat; a shared system prompt of %d words, user turns of %s words, answers of %d tokens "
        "appended), through HAProxy, the hit rate from the replicas' /metrics" %
        (a.users, a.rounds, a.join_rate, a.system_words, a.turn_words, a.max_tokens))
    rr = run_workload(a, "roundrobin", work, log)
    af = run_workload(a, None, work, log)
    log("")
    log("%-28s %14s %14s" % ("", "round robin", "prefix affinity"))
    log("%-28s %14.3f %14.3f" % ("prefix-cache hit rate", rr["hit_rate"], af["hit_rate"]))
    log("%-28s %14d %14d" % ("prefix-cache misses (tokens)", rr["misses"], af["misses"]))
    log("%-28s %14d %14d" % ("prompt tokens queried", rr["queries"], af["queries"]))
    log("%-28s %14.3f %14.3f" % ("TTFT p50, rounds 2+ (s)", rr["ttft_p50"], af["ttft_p50"]))
    log("%-28s %14.3f %14.3f" % ("TTFT p90, rounds 2+ (s)", rr["ttft_p90"], af["ttft_p90"]))
    log("%-28s %14d %14d" % ("requests timed (rounds 2+)", rr["n_ttft"], af["n_ttft"]))
    log("%-28s %14d %14d" % ("failed requests", rr["failed"], af["failed"]))
    log("")
    miss_ratio = af["misses"] / rr["misses"] if rr["misses"] else float("nan")
    log("affinity: hit rate %.3f (goal >= 0.85), misses %.2fx round robin's (goal <= 0.5), TTFT p50 %.0f%% "
        "and p90 %.0f%% lower (goal >= 40%%)" %
        (af["hit_rate"], miss_ratio, 100 * (1 - af["ttft_p50"] / rr["ttft_p50"]),
         100 * (1 - af["ttft_p90"] / rr["ttft_p90"])))
    shutil.rmtree(work, ignore_errors=True)
    if out:
        out.close()
    return 0 if not rr["failed"] and not af["failed"] and not rr["rc"] and not af["rc"] else 1


def haproxy_version():
    try:
        return subprocess.run([HAPROXY[0], "-v"], capture_output=True,
                              text=True, timeout=10).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm", default=os.path.join(ROOT, "llm"))
    ap.add_argument("--haproxy", default=HAPROXY[0])
    ap.add_argument("-m", "--model", default=None,
                    help="default: testdata/models/stories260K.gguf (test), the default SmolLM2 (figure)")
    ap.add_argument("--deadline", type=float, default=600,
                    help="seconds the whole run may take (default 600; the figure takes about 6 minutes "
                    "on 2 cores)")
    ap.add_argument("--figure", action="store_true", help="round robin vs prefix affinity, not the test")
    ap.add_argument("--log", help="--figure: also write the report to this file")
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--system-words", type=int, default=600)
    ap.add_argument("--turn-words", default="60:60", help="--figure: each user turn's words, MIN:MAX")
    ap.add_argument("--join-rate", type=float, default=1.0, help="--figure: users joining per second")
    ap.add_argument("--serve-args", default="--kv-gib 0.5", help="--figure: more llm serve flags")
    a = ap.parse_args()
    if a.model is None:
        a.model = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf" if a.figure
                               else "testdata/models/stories260K.gguf")
    for path, what in ((a.llm, "llm (make llm)"), (a.model, "the model"), (CFG, "deploy/haproxy.cfg")):
        if not os.path.exists(path):
            print("cluster_test: %s is missing: %s" % (what, path), file=sys.stderr)
            return 2
    HAPROXY[0] = a.haproxy
    if not os.path.exists(a.haproxy):
        print("cluster_test: haproxy is missing: %s (apt-get install haproxy)" % a.haproxy, file=sys.stderr)
        return 2

    # the deadline, and a SIGTERM or SIGINT: stop everything started, then exit
    def on_signal(sig, frame):
        raise SystemExit("cluster_test: %s" % ("deadline of %g s passed" % a.deadline if sig == signal.SIGALRM
                                               else "stopped by signal %d" % sig))
    for s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    signal.alarm(int(a.deadline))
    try:
        return run_figure(a) if a.figure else run_test(a)
    finally:
        stop_all()


if __name__ == "__main__":
    sys.exit(main())
