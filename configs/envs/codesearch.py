#!/usr/bin/python3
"""codesearch: a code search service over Python's standard library.

At boot it reads every module of the standard library of its environment
(Debian's python3, about 500 files and 270,000 lines), splits each line into
identifiers and their parts (snake_case and CamelCase words), and builds an
inverted index from each term to the lines that hold it with BM25 weights; it
also parses every module (ast) into a table of its definitions (qualified
name, signature and the first line of the docstring of every class, function
and method) and a cross-reference of its call sites. That is several seconds
of CPU work on one core (about 5 s on a 2-core node), and the index lives
only in the process's memory. Only then does it listen, so that its
readiness probe (GET /healthz) passes once the index is built; a restored
instance answers at once, with the index (and the build time it reports) of
the instance that was checkpointed.

    codesearch [--port 8080] [ROOT...]      default ROOT: the stdlib directory

HTTP API (JSON):
    GET /healthz            {"status": "ok", "built_at": ..., "build_seconds": ..., ...}
    GET /search?q=WORDS[&n=10]
                            lines holding every word (else any), best first:
                            BM25 over lines, definitions of a word first
    GET /def?name=NAME      the definitions named NAME (or Class.NAME), with
                            their signature and docstring's first line
    GET /callers?name=NAME  the lines that call NAME (a function or method name)

Python standard library only. One thread, one request at a time: every
connection is closed when its response is sent, so that a checkpoint never
finds a half-closed connection.
"""

import argparse
import ast
import bisect
import gc
import heapq
import json
import math
import os
import re
import sys
import sysconfig
import time
from array import array
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

# Directories of the standard library that are not modules of the running
# interpreter (Debian ships most of them in other packages anyway).
SKIP = {"__pycache__", "test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3",
        "distutils", "ensurepip", "site-packages", "dist-packages"}
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]+")
PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
K1, B = 1.2, 0.75  # BM25


def log(*args):
    print("codesearch:", *args, file=sys.stderr, flush=True)


def terms_of(word, cache):
    """The index terms of an identifier: itself and its parts, lower case."""
    t = cache.get(word)
    if t is None:
        t = {word.lower()}
        t.update(p.lower() for p in PART.findall(word) if len(p) > 1)
        t = cache[word] = tuple(t)
    return t


def signature(node):
    """"(a, b=None, *args)" of a function, "(Base)" of a class."""
    try:
        if isinstance(node, ast.ClassDef):
            return "(" + ", ".join(ast.unparse(b) for b in node.bases) + ")" if node.bases else ""
        return "(" + ast.unparse(node.args) + ")"
    except Exception:  # a construct unparse does not know: no signature
        return ""


class Index:
    """Lines of files, the terms of each line with BM25 weights, and the
    definitions of every module."""

    def __init__(self, roots):
        t0 = time.monotonic()
        self.paths, modules = [], []
        for root in roots:
            root = root.rstrip("/")
            for d, dirs, files in os.walk(root):
                dirs[:] = sorted(x for x in dirs if x not in SKIP)
                for f in sorted(files):
                    if f.endswith(".py"):
                        self.paths.append(os.path.join(d, f))
                        mod = os.path.relpath(os.path.join(d, f[:-3]), root).replace(os.sep, ".")
                        modules.append(mod[:-len(".__init__")] if mod.endswith(".__init__") else mod)
        self.first = array("I")  # global id of each file's first line
        self.length = array("H")  # terms per line
        self.is_def = bytearray()  # 1 where a definition starts
        self.defs = []  # (qualified name, signature, doc, line id)
        self.def_names = {}  # lower-case name and parts -> indexes into defs
        self.calls = {}  # called name -> line ids of the calls
        self.unparsed = 0
        postings = {}  # term -> line ids (ascending)
        cache = {}
        line_id = 0
        nbytes = 0
        for path, module in zip(self.paths, modules):
            self.first.append(line_id)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            nbytes += len(text)
            for line in text.split("\n"):
                terms = set()
                for w in set(WORD.findall(line)):
                    terms.update(terms_of(w, cache))
                for t in terms:
                    p = postings.get(t)
                    if p is None:
                        p = postings[t] = array("I")
                    p.append(line_id)
                self.length.append(min(len(terms), 65535))
                self.is_def.append(0)
                line_id += 1
            try:
                tree = ast.parse(text, path)
            except (SyntaxError, ValueError):
                self.unparsed += 1
                continue
            base = self.first[-1] - 1
            self._definitions(tree.body, module + ".", base, cache)
            calls = self.calls
            for node in ast.walk(tree):
                if type(node) is ast.Call:
                    f = node.func
                    name = f.id if type(f) is ast.Name else f.attr if type(f) is ast.Attribute else None
                    if name:
                        c = calls.get(name)
                        if c is None:
                            c = calls[name] = array("I")
                        c.append(base + node.lineno)
        self.lines = line_id
        self.bytes = nbytes
        # BM25 weight of each (term, line): idf(term) * (k1 + 1) / (1 + k1 *
        # (1 - b + b * len(line) / avglen)), the line holding the term once.
        avg = (sum(self.length) / max(self.lines, 1)) or 1.0
        norm = [(K1 + 1) / (1 + K1 * (1 - B + B * n / avg)) for n in range(max(self.length, default=0) + 1)]
        length = self.length
        self.postings = postings
        self.weights = {}
        for t, p in postings.items():
            idf = math.log(1 + (self.lines - len(p) + 0.5) / (len(p) + 0.5))
            self.weights[t] = array("f", [idf * norm[length[i]] for i in p])
        del cache
        gc.collect()
        self.seconds = time.monotonic() - t0
        self.built_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def _definitions(self, body, prefix, base, cache):
        """Records the classes and functions of body (a module's, a class's)."""
        for node in body:
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            line_id = base + node.lineno
            doc = (ast.get_docstring(node, clean=False) or "").strip().split("\n", 1)[0][:200]
            k = len(self.defs)
            self.defs.append((prefix + node.name, signature(node), doc, line_id))
            if line_id < len(self.is_def):
                self.is_def[line_id] = 1
            for t in terms_of(node.name, cache):
                self.def_names.setdefault(t, []).append(k)
            if isinstance(node, ast.ClassDef):
                self._definitions(node.body, prefix + node.name + ".", base, cache)

    def where(self, line_id):
        """(path, line number from 1) of a global line id."""
        f = bisect.bisect_right(self.first, line_id) - 1
        return self.paths[f], line_id - self.first[f] + 1

    def text(self, line_id):
        path, n = self.where(line_id)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for i, line in enumerate(f, 1):
                    if i == n:
                        return line.rstrip("\n")
        except OSError:
            pass
        return ""

    def hit(self, line_id, score=None):
        path, n = self.where(line_id)
        h = {"path": path, "line": n, "text": self.text(line_id).strip()[:200]}
        if score is not None:
            h["score"] = round(score, 3)
        return h

    def search(self, query, n):
        words = [t for w in WORD.findall(query) for t in terms_of(w, {})] or [query.lower()]
        words = [w for w in dict.fromkeys(words) if w in self.postings]
        if not words:
            return 0, []
        # Every word (AND) if some line has them all, else any (OR).
        sets = [set(self.postings[w]) for w in words]
        match = set.intersection(*sets) or set.union(*sets)
        scores = dict.fromkeys(match, 0.0)
        for w in words:
            for i, wt in zip(self.postings[w], self.weights[w]):
                if i in scores:
                    scores[i] += wt
        for i in scores:
            if self.is_def[i]:
                scores[i] *= 2
        best = heapq.nlargest(n, scores.items(), key=lambda kv: (kv[1], -kv[0]))
        return len(match), [self.hit(i, s) for i, s in best]

    def lookup(self, name, n=50):
        """The definitions called name (case-insensitive), or whose qualified
        name ends with it (Class.method), else those whose name has it as a
        part; exact names first."""
        key = name.lower()
        found = []
        for k in self.def_names.get(key.rsplit(".", 1)[-1], ()):
            qual, sig, doc, line_id = self.defs[k]
            q = qual.lower()
            rank = 0 if q.rsplit(".", 1)[-1] == key or q.endswith("." + key) else 1
            if "." in key and rank:
                continue
            found.append((rank, len(qual), qual, sig, doc, line_id))
        found.sort()
        out = []
        for _, _, qual, sig, doc, line_id in found[:n]:
            h = {"name": qual, "signature": sig, "doc": doc,
                 "calls": len(self.calls.get(qual.rsplit(".", 1)[-1], ()))}
            h.update(self.hit(line_id))
            out.append(h)
        return out

    def stats(self):
        return {"files": len(self.paths), "lines": self.lines, "bytes": self.bytes,
                "terms": len(self.postings), "postings": sum(len(p) for p in self.postings.values()),
                "definitions": len(self.defs), "call_sites": sum(len(c) for c in self.calls.values()),
                "unparsed_files": self.unparsed,
                "built_at": self.built_at, "build_seconds": round(self.seconds, 3)}


def handler(index, started):
    class Handler(BaseHTTPRequestHandler):
        server_version = "codesearch/1"
        protocol_version = "HTTP/1.0"  # one request per connection, closed after it

        def reply(self, code, body):
            b = (json.dumps(body, indent=1) + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

        def do_GET(self):
            u = urlsplit(self.path)
            q = parse_qs(u.query)
            if u.path == "/healthz":
                self.reply(200, dict(status="ok", pid=os.getpid(), started_at=started, **index.stats()))
            elif u.path == "/search" and q.get("q"):
                t = time.monotonic()
                try:
                    n = max(1, min(int(q.get("n", ["10"])[0]), 100))
                except ValueError:
                    return self.reply(400, {"error": "n: want a number from 1 to 100"})
                total, hits = index.search(q["q"][0][:200], n)
                self.reply(200, {"query": q["q"][0][:200], "matches": total, "hits": hits,
                                 "ms": round((time.monotonic() - t) * 1000, 2), "index_built_at": index.built_at})
            elif u.path == "/callers" and q.get("name"):
                ids = index.calls.get(q["name"][0], array("I"))
                self.reply(200, {"name": q["name"][0][:200], "calls": len(ids),
                                 "callers": [index.hit(i) for i in ids[:50]]})
            elif u.path == "/def" and q.get("name"):
                self.reply(200, {"name": q["name"][0][:200], "definitions": index.lookup(q["name"][0][:200])})
            else:
                self.reply(404, {"error": "try GET /search?q=WORDS, /def?name=NAME, /callers?name=NAME or /healthz"})

        def log_message(self, fmt, *args):
            if not self.path.startswith("/healthz"):  # the readiness probe polls it
                log(self.address_string(), fmt % args)

    return Handler


def main():
    ap = argparse.ArgumentParser(description="Code search over Python's standard library (index built at boot).")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("roots", nargs="*", default=[sysconfig.get_paths()["stdlib"]])
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    log("indexing", " ".join(a.roots))
    index = Index(a.roots)
    s = index.stats()
    log(f"indexed {s['files']} files, {s['lines']} lines, {s['terms']} terms, {s['postings']} postings, "
        f"{s['definitions']} definitions in {s['build_seconds']} s")
    srv = HTTPServer(("0.0.0.0", a.port), handler(index, started))
    log(f"serving on :{a.port}")
    srv.serve_forever()


if __name__ == "__main__":
    main()
