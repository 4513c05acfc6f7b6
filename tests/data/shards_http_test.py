#!/usr/bin/env python3
"""Shards over HTTP for real (data::HttpSource through `ember_shards`).

A real HTTP server on the loopback address (Python's http.server, one thread
per request) serves shards written here, misbehaving on purpose by path:

  /ok/       the file, with Range support (206)
  /norange/  the file, Range ignored (always 200 and the whole body)
  /flaky/    the first request of each file is cut mid-body (connection
             closed); the next ones are served: the retry resumes with Range
  /flaky-norange/  cut first, then Range ignored: the retry drops what it had
  /404/  /500/     that status, always
  /reset/    every request cut mid-body
  /stall/    half the body, then nothing for 60 s

`ember_shards --retries 2 --backoff 0.05 --stall 1 list URL` must list the
same members as the local file for the first four, and for the others exit 1
within the test's timeout (never a hang) with a message naming the URL and
what happened, after the documented attempts: 404 once (not retried), 500,
resets and stalls 3 times (the server counts the requests). Then `index`
and `verify` work on a brace pattern of http:// URLs.

    python3 tests/data/shards_http_test.py --binary build/bin/ember_shards --work /tmp/x
"""
import argparse
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
import io
from collections import Counter
from pathlib import Path


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove."""
    if not ok:
        raise AssertionError(what)


REQUESTS = Counter()  # (mode, name) -> requests seen
LOCK = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    root = None
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        parts = self.path.strip("/").split("/", 1)
        if len(parts) != 2:
            self.send_error(400)
            return
        mode, name = parts
        with LOCK:
            REQUESTS[(mode, name)] += 1
            nth = REQUESTS[(mode, name)]
        path = self.root / name
        if mode in ("404", "500") or not path.is_file():
            status = 500 if mode == "500" else 404
            body = b"not here\n"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        data = path.read_bytes()
        start = 0
        rng = self.headers.get("Range")
        honour_range = mode in ("ok", "flaky", "reset", "stall")
        if rng and honour_range:
            start = int(rng.split("=")[1].split("-")[0])
        body = data[start:]
        if start > 0:
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes" if honour_range else "none")
        self.end_headers()
        cut = (mode in ("flaky", "flaky-norange") and nth == 1) or mode == "reset"
        try:
            if cut:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if mode == "stall":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                time.sleep(60)
                return
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass


def write_shard(path, n, seed):
    rnd = __import__("random").Random(seed)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(n):
            for ext, data in (("bin", rnd.randbytes(3000)), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"{seed:02d}{i:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def run(binary, *args, timeout=40):
    start = time.time()
    r = subprocess.run([binary, "--retries", "2", "--backoff", "0.05", "--stall", "1", *args],
                       capture_output=True, text=True, timeout=timeout)
    return r, time.time() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for s in range(3):
        write_shard(work / f"train-{s:06d}.tar", 60, s)
    Handler.root = work
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    local, _ = run(a.binary, "list", str(work / "train-000001.tar"))
    check(local.returncode == 0 and local.stdout.count("\n") == 121, f"local list: {local.returncode} {local.stderr}")
    want = [line for line in local.stdout.splitlines() if not line.startswith("#")]
    for mode in ("ok", "norange", "flaky", "flaky-norange"):
        url = f"{base}/{mode}/train-000001.tar"
        r, took = run(a.binary, "list", url)
        check(r.returncode == 0, f"{mode}: exit {r.returncode}: {r.stderr}")
        got = [line for line in r.stdout.splitlines() if not line.startswith("#")]
        check(got == want, f"{mode}: {len(got)} members listed, {len(want)} in the file, or other bytes")
        n = REQUESTS[(mode, "train-000001.tar")]
        check(n == (2 if mode.startswith("flaky") else 1), f"{mode}: {n} requests")
        print(f"[http] {mode}: the shard read whole ({n} request(s), {took:.1f} s)")

    def fails(mode, needles, requests):
        url = f"{base}/{mode}/train-000002.tar"
        r, took = run(a.binary, "list", url)
        check(r.returncode == 1, f"{mode}: exit {r.returncode}, want 1: {r.stderr}")
        for needle in [url] + needles:
            check(needle in r.stderr, f"{mode}: {needle!r} not in the message {r.stderr!r}")
        n = REQUESTS[(mode, "train-000002.tar")]
        check(n == requests, f"{mode}: {n} requests, want {requests}")
        print(f"[http] {mode}: exit 1 after {n} request(s), {took:.1f} s: {r.stderr.strip()[:160]}")

    fails("404", ["HTTP status 404", "after 1 attempt(s)", "not retried"], 1)
    fails("500", ["HTTP status 500", "after 3 attempt(s)", "retried 2 times"], 3)
    fails("reset", ["after 3 attempt(s)", "at byte"], 3)
    fails("stall", ["after 3 attempt(s)", "at byte"], 3)

    # index and verify over a brace pattern of URLs.
    manifest = work / "http.json"
    r, _ = run(a.binary, "index", f"{base}/ok/train-{{000000..000002}}.tar", "--out", str(manifest))
    check(r.returncode == 0, f"index over http: {r.stderr}")
    r, _ = run(a.binary, "verify", str(manifest))
    check(r.returncode == 0 and "180 samples read, 0 disagree" in r.stderr, f"verify over http: {r.stderr}")
    print("[http] index and verify over http:// URLs: 3 shards, 180 samples")
    server.shutdown()
    print("[http] passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
