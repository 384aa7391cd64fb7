"""A small shop served on 127.0.0.1 for the WebArena tests: real HTTP, real pages, no real WebArena.

    site = LocalSite().start()          # http.server in a thread, an ephemeral port
    site.url("/catalogsearch/result/?q=bag")
    site.environ()                      # the WA_* variables, every site on this server
    site.requests                       # the paths it was asked for
    site.stop()

Pages: a home page with a search form, links (to a product, to a page in a new tab, to another host and
to a local file) and buttons (a window.open, a script navigation to another host, a fetch to another
host); BrowserGym's shopping login page (/customer/account/login/, the form its WebArena ui_login fills);
search results; products; a contact form whose comment is kept and shown on /account. `other` (a
second LocalSite on 127.0.0.2) is the host that must never be reached.
"""
from __future__ import annotations

import html
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CATALOG = {"a": ("Leather bag", "$19.99"), "b": ("Canvas bag", "$12.50"), "c": ("Wool scarf", "$25.00")}


def _page(title: str, body: str) -> bytes:
    return f"<!doctype html><html><head><title>{html.escape(title)}</title></head><body>{body}</body></html>".encode()


class LocalSite:
    """One HTTP server on `host` (127.0.0.1 by default) and an ephemeral port, serving the shop above.
    `other`: the URL of a host the pages link to and call, which the tests expect never to be reached."""

    def __init__(self, host: str = "127.0.0.1", other: str = "http://127.0.0.2:9"):
        self.host, self.other = host, other
        self.requests: list[str] = []
        self.comment = ""
        self.logged_in = False
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, body: bytes, status: int = 200, headers: dict | None = None):
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                site.requests.append(self.path)
                self._send(*site.get(self.path))

            def do_POST(self):
                site.requests.append("POST " + self.path)
                n = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(n).decode())
                self._send(*site.post(self.path, {k: v[0] for k, v in form.items()}))

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]

    def url(self, path: str = "/") -> str:
        """The absolute URL of `path` on this server."""
        return f"http://{self.host}:{self.port}{path}"

    def environ(self) -> dict[str, str]:
        """The seven WA_* variables, every WebArena site on this server (under its own path)."""
        paths = {"WA_SHOPPING": "", "WA_SHOPPING_ADMIN": "/admin", "WA_REDDIT": "/forum", "WA_GITLAB": "/git",
                 "WA_WIKIPEDIA": "/wiki", "WA_MAP": "/map", "WA_HOMEPAGE": "/home"}
        return {k: self.url(p) if p else self.url("").rstrip("/") for k, p in paths.items()}

    def start(self) -> "LocalSite":
        """Serve in a daemon thread; returns self."""
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()

    # -- pages
    def get(self, path: str):
        parts = urllib.parse.urlsplit(path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items()}
        p = parts.path
        if p in ("/", "/admin", "/forum", "/git", "/wiki", "/map", "/home"):
            return (_page("One Stop Market", f"""
<h1>One Stop Market</h1>
<form action="/catalogsearch/result/" method="get">
  <label for="q">Search</label> <input id="q" name="q" type="text"> <button type="submit">Search</button>
</form>
<ul>
  <li><a href="/product/a">Leather bag</a></li>
  <li><a href="/contact">Contact us</a></li>
  <li><a href="/deals" target="_blank">Deals in a new tab</a></li>
  <li><a href="{self.other}/partner">Partner site</a></li>
  <li><a href="file:///etc/hostname">Local file</a></li>
  <li><a href="http://localhost:{self.port}/">This shop by another name</a></li>
</ul>
<button onclick="window.open('/deals')">Open deals</button>
<button onclick="location.href='{self.other}/scripted'">Go to partner</button>
<button onclick="fetch('{self.other}/beacon').catch(() => document.title = 'fetch failed')">Ping partner</button>
<p id="status">{'Welcome back' if self.logged_in else 'Not signed in'}</p>"""),)
        if p == "/customer/account/login/":
            return (_page("Customer Login", """
<h1>Customer Login</h1>
<form action="/customer/account/loginPost/" method="post">
  <label for="email">Email</label> <input id="email" name="login[username]" type="email">
  <label for="pass">Password</label> <input id="pass" name="login[password]" type="password">
  <button type="submit">Sign In</button>
</form>"""),)
        if p == "/catalogsearch/result/":
            q = query.get("q", "")
            hits = [f"<li><a href='/product/{k}'>{html.escape(name)}</a> {price}</li>"
                    for k, (name, price) in CATALOG.items() if q and q.lower() in name.lower()]
            return (_page(f"Search results for: '{q}'", f"<h1>Search results for: '{html.escape(q)}'</h1>"
                          f"<p>{len(hits)} items</p><ul>{''.join(hits)}</ul><a href='/'>Home</a>"),)
        if p.startswith("/product/") and p[len("/product/"):] in CATALOG:
            name, price = CATALOG[p[len("/product/"):]]
            return (_page(name, f"<h1>{name}</h1><p>Price: <span id='price'>{price}</span></p><a href='/'>Home</a>"),)
        if p == "/deals":
            return (_page("Deals of the day", "<h1>Deals of the day</h1><p>Scarves half price</p>"),)
        if p == "/contact":
            return (_page("Contact us", """
<h1>Contact us</h1>
<form action="/contact" method="post">
  <label for="name">Your name</label> <input id="name" name="name" type="text">
  <label for="comment">Comment</label> <textarea id="comment" name="comment"></textarea>
  <button type="submit">Submit</button>
</form>"""),)
        if p == "/account":
            return (_page("My account", f"<h1>My account</h1><p id='comment'>{html.escape(self.comment)}</p>"),)
        return (_page("404", "<h1>Not found</h1>"), 404)

    def post(self, path: str, form: dict):
        if path == "/customer/account/loginPost/":
            self.logged_in = (form.get("login[username]"), form.get("login[password]")) == (
                "emma.lopez@gmail.com", "Password.123")  # libwebarena's shopping account
            return b"", 302, {"Location": "/"}
        if path == "/contact":
            self.comment = form.get("comment", "")
            return _page("Thanks", "<h1>Thank you for your comment</h1><a href='/'>Home</a>"), 200
        return _page("404", "<h1>Not found</h1>"), 404


class FakeJudge:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that answers `verdict(prompt_text)` (a function of the
    user message) and keeps every request it got (`asked`): the LLM judge, without a model."""

    def __init__(self, verdict):
        self.asked: list[dict] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, obj):
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # /v1/models
                self._json({"object": "list", "data": [{"id": "fake-judge", "object": "model"}]})

            def do_POST(self):  # /v1/chat/completions
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                judge.asked.append(dict(req, path=self.path))
                text = verdict(req["messages"][-1]["content"])
                self._json({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
