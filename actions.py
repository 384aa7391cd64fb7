"""The action language: the model's raw text -> one canonical action string, parsed, never executed.

    from actions import parse_action, split_action, ActionParseError
    parse_action("<think>the OK button</think> click(13)")   # -> "click('13')"
    split_action("fill('14', 'Myron')")                      # -> ("fill", ["14", "Myron"])
    try:
        parse_action("I would click OK")
    except ActionParseError as e:                            # a ValueError; str(e) is shown to the agent
        print(e.kind, e)                                     # no_action, no action found; reply with ...

ACTIONS lists the whitelisted calls and their parameters; `parse_action`'s docstring is the grammar
(prose, ``` fences, <think> blocks, several calls, argument rules). The canonical form is positional with
each argument as its repr: parse_action(canonical) == canonical. Pure text: `ast` parses, nothing is
evaluated, and nothing here touches a browser (browser.py runs the canonical action).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from axtree import BID
from keys import canonical_keys

class ActionParseError(ValueError):
    """The model's text holds no valid action. The message (str(e)) is shown to the agent.

    `kind` names the failure for code and tests: empty, too_long, no_action, unclosed_think,
    unclosed, syntax, not_plain, unknown_action, star_args, not_literal, too_many_args,
    bad_keyword, missing_arg, bad_bid, bad_number, bad_options, bad_text, bad_key.
    """

    def __init__(self, message: str, kind: str = "invalid"):
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):  # keep `kind` across pickling (multiprocessing)
        return type(self), (str(self), self.kind)


# name -> parameter names (positional order); the canonical form is positional.
ACTIONS: dict[str, tuple[str, ...]] = {
    "click": ("bid",),
    "dblclick": ("bid",),
    "hover": ("bid",),
    "focus": ("bid",),
    "clear": ("bid",),
    "check": ("bid",),
    "uncheck": ("bid",),
    "fill": ("bid", "value"),
    "select_option": ("bid", "options"),
    "press": ("bid", "key_comb"),
    "scroll": ("delta_x", "delta_y"),
    "send_msg_to_user": ("text",),
    "noop": (),
}
# The general web's actions (WebArena-Lite; BrowserGym's "nav", "tab", keyboard and "infeas" functions, with
# their names and parameters): MiniWoB's, then navigation, tabs, the keyboard without an element, and
# giving up. parse_action(text, WEB_ACTIONS) accepts them; MiniWoB's grammar (ACTIONS, the default) does not.
WEB_ACTIONS: dict[str, tuple[str, ...]] = {
    **ACTIONS, "goto": ("url",), "go_back": (), "go_forward": (), "new_tab": (), "tab_focus": ("index",),
    "tab_close": (), "keyboard_press": ("key",), "keyboard_down": ("key",), "keyboard_up": ("key",),
    "keyboard_type": ("text",), "keyboard_insert_text": ("text",), "report_infeasible": ("reason",)}
ACTION_SETS = {"miniwob": ACTIONS, "web": WEB_ACTIONS}  # a benchmark's grammar by name (env.py)
_ALIASES = {"text": "value", "option": "options", "key": "key_comb", "dx": "delta_x", "dy": "delta_y",
            "message": "text", "msg": "text", "tab": "index", "tab_index": "index", "href": "url", "link": "url"}
_MAX_TAB = 1000            # tab_focus() index bound
_BID_RE = re.compile(BID)  # a bid as the tree writes it: "13", "a12"
# `name(` or `obj.name(`; no space around the dot: "...the OK button. click('15')" is prose then a call
_CALL_START = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\(")
_EXAMPLE = "reply with one call such as click('12') or fill('14', 'text')"
MAX_REPLY_CHARS = 50_000   # longer replies are refused unread; scanning 50k takes < 0.3 s (2 busy cores)
_MAX_NESTING = 4           # brackets inside one call (a valid action nests at most 2): deeper is refused unparsed
_MAX_SCROLL = 1e9          # pixels; also refuses inf and nan
_PAIRS = {"(": ")", "[": "]", "{": "}"}
_CODE_RUN = re.compile(r"[^'\"()\[\]{}#]+")
# The rest of a string literal after its opening quote(s), closing quote(s) included. A one-quote
# string may run over real newlines (models write them inside text); they are escaped before ast.
_STRING_REST = {
    "'": re.compile(r"[^'\\]*(?:\\.[^'\\]*)*'", re.S),
    '"': re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S),
    "'''": re.compile(r"[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''", re.S),
    '"""': re.compile(r'[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""', re.S),
}
_LINE_STRING_REST = {"'": re.compile(r"[^'\\\n]*(?:\\.[^'\\\n]*)*'"),  # a string in code outside calls
                     '"': re.compile(r'[^"\\\n]*(?:\\.[^"\\\n]*)*"')}
_QUOTE_OR_HASH = re.compile(r"['\"#]")
_TRAILING_COMMENT = re.compile(r"[ \t]*#")
_VALID_ESCAPES = frozenset("\\'\"abfnrtv01234567xNuU")
_STRING_FIX = re.compile(r"\\(?:\r\n|.)|[\r\n\x00]", re.S)


def _literal(node: ast.AST):
    """A Python literal from an ast node, or raise: str, int, float, -number, list of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)) and not isinstance(node.value, bool):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float)):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    raise ActionParseError(
        f"arguments must be literals (quoted strings or numbers), got {_snippet(ast.unparse(node))}; {_EXAMPLE}",
        "not_literal")


def _snippet(s: str, limit: int = 60) -> str:
    return repr(s if len(s) <= limit else s[:limit] + "...")


def _match_paren(t: str, p: int, cache: dict) -> tuple[int, int] | None:
    """Lexically match the '(' at t[p], skipping strings, comments and nested brackets:
    (index of its ')', bracket depth) or None if it never closes (or a bracket mismatches).
    Every '(' met in code position gets its own result cached (lexing from it sees the same
    tokens), so a long reply full of call starts is still lexed about once."""
    if p in cache:
        return cache[p]
    stack, inner = [p], [0]  # open brackets; deepest nesting seen inside each
    i, n = p + 1, len(t)
    while i < n:
        c = t[i]
        if c in "([{":
            hit = cache.get(i, False) if c == "(" else False
            if hit is None:
                break
            if hit:
                inner[-1] = max(inner[-1], hit[1])
                i = hit[0] + 1
                continue
            stack.append(i)
            inner.append(0)
            i += 1
        elif c in ")]}":
            if _PAIRS[t[stack[-1]]] != c:
                break
            o, d = stack.pop(), inner.pop() + 1
            if t[o] == "(":
                cache[o] = (i, d)
            if not stack:
                return cache[o]
            inner[-1] = max(inner[-1], d)
            i += 1
        elif c == "#":
            i = t.find("\n", i)
            if i < 0:
                break
        elif c in "'\"":
            q = c * 3 if t.startswith(c * 3, i) else c
            m = _STRING_REST[q].match(t, i + len(q))
            if not m:
                break
            i = m.end()
        else:
            i = _CODE_RUN.match(t, i).end()
    for o in stack:
        if t[o] == "(":
            cache[o] = None
    return None


def _fix_string_body(body: str) -> str:
    """The body of a non-raw string literal, rewritten so that ast reads what the model wrote:
    a real newline, carriage return or NUL becomes its escape (kept in the value, not turned into
    a space), an unknown escape such as \\d keeps its backslash (Python's rule, without its
    warning, which -W error would turn into a SyntaxError), a backslash before a line end joins
    the lines (Python's rule)."""
    def fix(m: re.Match) -> str:
        s = m.group()
        if len(s) == 1:
            return {"\n": "\\n", "\r": "\\r", "\x00": "\\x00"}[s]
        if s[1] in "\r\n":
            return ""
        return s if s[1] in _VALID_ESCAPES else "\\" + s
    return _STRING_FIX.sub(fix, body)


def _rewrite(seg: str) -> str:
    """A lexically closed call with the bodies of its non-raw string literals fixed (above)."""
    out, i = [], 0
    while True:
        m = _QUOTE_OR_HASH.search(seg, i)
        if not m:
            out.append(seg[i:])
            return "".join(out)
        h = m.start()
        if seg[h] == "#":  # a comment inside the call: it ends at a newline before the ')'
            j = seg.find("\n", h)
            out.append(seg[i:j])
            i = j
            continue
        q = seg[h] * 3 if seg.startswith(seg[h] * 3, h) else seg[h]
        end = _STRING_REST[q].match(seg, h + len(q)).end()  # matches: _match_paren lexed it
        k = h
        while k > 0 and h - k < 2 and seg[k - 1] in "rRbBuUfF":
            k -= 1
        raw = "r" in seg[k:h].lower() and (k == 0 or not (seg[k - 1].isalnum() or seg[k - 1] == "_"))
        body = seg[h + len(q):end - len(q)]
        out += [seg[i:h + len(q)], body if raw else _fix_string_body(body), q]
        i = end


@dataclass
class _Candidate:
    """One `name(` in the reply: a call that parses (node) or why it does not (error)."""
    start: int
    end: int                  # past its ')' (the end of the text when it never closes)
    head: str                 # the callee as written: "click", "page.click"
    node: ast.Call | None = None
    src: str = ""             # the text ast parsed (for the source of number literals)
    error: ActionParseError | None = None


def _scan(text: str, actions: dict) -> list[_Candidate]:
    """Every `name(` in the text, left to right, except those inside a call that parses (the
    text of an argument is not searched). ast.parse only parses: nothing is evaluated. `actions`:
    the grammar's whitelist (only a broken call of one of them is kept as an error)."""
    cache: dict = {}
    out, last_end = [], 0
    for m in _CALL_START.finditer(text):
        s = m.start()
        if s < last_end:
            continue
        head = m.group()[:-1]
        hit = _match_paren(text, m.end() - 1, cache)
        if hit is None:
            if head in actions:  # only a broken whitelisted call can be the answer (an error)
                out.append(_Candidate(s, len(text), head, error=ActionParseError(
                    f"the action {_snippet(text[s:s + 80])} is not closed: close its quotes and end it with ')'; "
                    f"{_EXAMPLE}", "unclosed")))
            continue
        close, depth = hit
        why = "brackets nested too deeply"
        if depth <= _MAX_NESTING:
            src = "(" + _rewrite(text[s:close + 1]) + ")"
            try:
                node = ast.parse(src, mode="eval").body
            except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
                why = getattr(e, "msg", None) or str(e) or type(e).__name__
            else:
                if isinstance(node, ast.Call):
                    out.append(_Candidate(s, close + 1, head, node, src))
                    last_end = close + 1
                    continue
                why = "not a call"
        if head in actions:
            out.append(_Candidate(s, close + 1, head, error=ActionParseError(
                f"could not parse {_snippet(text[s:min(close + 1, s + 80)])}: {why}; {_EXAMPLE}", "syntax")))
    return out


def _fence_comments(text: str, lo: int, hi: int, calls: list[_Candidate], mark: bytearray) -> None:
    """Mark the '#' comments of the code between lo and hi (a ``` block) in `mark`, skipping the
    calls (lexed already) and string literals (a '#' inside one is text)."""
    spans = [(c.start, c.end) for c in calls if c.end > lo and c.start < hi]
    k, pos = 0, lo
    while pos < hi:
        while k < len(spans) and spans[k][1] <= pos:
            k += 1
        if k < len(spans) and spans[k][0] <= pos:
            pos = spans[k][1]
            continue
        gap_end = min(spans[k][0], hi) if k < len(spans) else hi
        m = _QUOTE_OR_HASH.search(text, pos, gap_end)
        if not m:
            pos = gap_end
            continue
        h, c = m.start(), m.group()
        if c == "#":
            e = text.find("\n", h, hi)
            e = hi if e < 0 else e
            mark[h:e] = b"\x01" * (e - h)
            pos = e
            while k < len(spans) and spans[k][0] < e:  # a call that starts in the comment is comment
                pos = max(pos, spans[k][1])
                k += 1
        elif text.startswith(c * 3, h):
            s = _STRING_REST[c * 3].match(text, h + 3, gap_end)
            pos = s.end() if s else gap_end
        else:
            s = _LINE_STRING_REST[c].match(text, h + 1, gap_end)
            e = text.find("\n", h, gap_end)
            pos = s.end() if s else (gap_end if e < 0 else e)


def canonical(name: str, args: list) -> str:
    """The one string for an action: positional, each argument as its repr (a list of options
    as a list of reprs), so parse_action(canonical(...)) gives the same string back.
    canonical("fill", ["14", "x"]) -> "fill('14', 'x')". Inverse of split_action."""
    return f"{name}({', '.join(repr(a) for a in args)})"


def _number_text(node: ast.AST, src: str) -> str:
    """A number written where text is expected, exactly as the model wrote it: fill('3', 1.50)
    fills '1.50', not '1.5'; click(0x1F) is the bid '0x1F' (invalid), not '31'."""
    if isinstance(node, ast.UnaryOp):
        return ("-" if isinstance(node.op, ast.USub) else "+") + ast.get_source_segment(src, node.operand)
    return ast.get_source_segment(src, node)


def parse_action(text: str, actions: dict = ACTIONS) -> str:
    """Parse the model's raw text into one canonical action string.

    Grammar: one call of a whitelisted function (`actions`: ACTIONS, MiniWoB's, by default;
    WEB_ACTIONS for general sites) with literal arguments, e.g. `click('13')`, `fill('14', 'Myron')`,
    `select_option('9', ['a', 'b'])`, `scroll(0, 300)`, and on the web `goto('http://...')`,
    `tab_focus(1)`, `keyboard_press('Control+a')`.
    The text is parsed with `ast` (mode 'eval') and never executed.

    - Around the call: prose, ``` fences, and a <think>...</think> block are ignored: calls
      before the last </think> are thoughts, and so is everything after a <think> that is never
      closed. Inside a ``` block, `#` comments are ignored and other statements (an assignment,
      a comment line) may come before the call; a `# comment` after a call on its line is ignored
      anywhere. Nothing inside a call's string arguments is ever taken for markup or a call.
    - Several calls: the LAST one is the action (models often restate a plan before acting),
      `click('1') then click('2')` -> `click('2')`. If that last call is invalid, or the last
      `name(` of a whitelisted action after it never closes or does not parse, that is the
      error: an earlier call is never used instead.
    - Arguments: strings follow Python's literal rules (`'it\\'s'`, `"say \\"hi\\""`, `'a\\nb'` is a
      newline), except that a real newline inside quotes is kept as a newline. Integer bids are
      accepted (click(13) -> click('13')); a number where text is expected is kept as written
      (fill('3', 1.50) -> fill('3', '1.50')). Keyword arguments are made positional.
    - The canonical string is `name(repr(arg), ...)`: parse_action(canonical) == canonical.
    - A reply longer than MAX_REPLY_CHARS is refused (kind 'too_long') without being scanned.

    Returns: the canonical string, e.g. "click('13')".
    Errors: ActionParseError (a ValueError) with a message meant for the agent and a `kind`.
    """
    if not isinstance(text, str) or not text.strip():
        raise ActionParseError(f"empty reply; {_EXAMPLE}", "empty")
    if len(text) > MAX_REPLY_CHARS:
        raise ActionParseError(f"reply too long ({len(text)} characters, at most {MAX_REPLY_CHARS}); "
                               f"{_EXAMPLE}", "too_long")
    found = _scan(text, actions)
    calls = [c for c in found if c.node is not None]
    in_call = bytearray(len(text))
    for c in calls:
        in_call[c.start:c.end] = b"\x01" * (c.end - c.start)

    def markup(tag: str, lo: int = 0) -> list[int]:  # where a tag occurs outside every call
        out, i = [], text.find(tag, lo)
        while i >= 0:
            if not in_call[i]:
                out.append(i)
            i = text.find(tag, i + len(tag))
        return out

    ends = markup("</think>")
    lo = ends[-1] + len("</think>") if ends else 0
    opens = markup("<think>", lo)
    hi = opens[0] if opens else len(text)
    comment = bytearray(len(text))
    fences = markup("```", lo)
    for a, b in zip(fences[::2], fences[1::2] + [hi]):
        if a < hi:
            _fence_comments(text, a + 3, min(b, hi), calls, comment)
    live = []
    for c in found:
        if lo <= c.start < hi and not comment[c.start]:
            live.append(c)
            m = _TRAILING_COMMENT.match(text, c.end) if c.node is not None else None
            if m:
                e = text.find("\n", m.end())
                e = len(text) if e < 0 else e
                comment[m.end() - 1:e] = b"\x01" * (e - m.end() + 1)
    ok = [c for c in live if c.node is not None]
    after = ok[-1].end if ok else lo
    broken = [c for c in live if c.node is None and c.head in actions and c.start >= after]
    if broken:
        raise broken[-1].error
    if not ok:
        if opens:
            raise ActionParseError(f"the <think> block is not closed with </think>, so no action follows it; "
                                   f"{_EXAMPLE}", "unclosed_think")
        where = " after </think>" if ends else ""
        raise ActionParseError(f"no action found{where}; {_EXAMPLE}", "no_action")
    return _check_call(ok[-1].node, ok[-1].src, actions)


def _check_call(call: ast.Call, src: str, actions: dict) -> str:
    """The canonical string of one parsed call, or ActionParseError."""
    if not isinstance(call.func, ast.Name):
        raise ActionParseError(
            f"only plain action calls are allowed, not {_snippet(ast.unparse(call.func))}; {_EXAMPLE}",
            "not_plain")
    name = call.func.id
    if name not in actions:
        raise ActionParseError(f"unknown action {name!r}; allowed: {', '.join(actions)}", "unknown_action")
    params = actions[name]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise ActionParseError(f"*args/**kwargs are not allowed in {name}(); {_EXAMPLE}", "star_args")
    if len(call.args) > len(params):
        raise ActionParseError(f"{name}() takes {len(params)} argument(s) ({', '.join(params)}), "
                               f"got {len(call.args)}", "too_many_args")
    nodes = dict(zip(params, call.args))
    for kw in call.keywords:
        key = kw.arg if kw.arg in params else _ALIASES.get(kw.arg, kw.arg)
        if key not in params or key in nodes:
            raise ActionParseError(f"{name}() got an unexpected or repeated argument {kw.arg!r}", "bad_keyword")
        nodes[key] = kw.value
    missing = [p for p in params if p not in nodes]
    if missing:
        raise ActionParseError(f"{name}() is missing argument(s): {', '.join(missing)}; "
                               f"e.g. {_signature_example(name)}", "missing_arg")
    out = []
    for p in params:
        node = nodes[p]
        v = _literal(node)
        if p == "bid":
            if isinstance(v, (int, float)):
                v = _number_text(node, src)
            if not isinstance(v, str) or not _BID_RE.fullmatch(v.strip()):
                raise ActionParseError(f"bid must be an element id from the tree such as '12', "
                                       f"got {_snippet(str(v))}", "bad_bid")
            v = v.strip()
        elif p in ("delta_x", "delta_y"):
            if not isinstance(v, (int, float)) or not abs(v) <= _MAX_SCROLL:
                raise ActionParseError(f"scroll() takes two numbers of pixels such as scroll(0, 300), "
                                       f"got {_snippet(str(v))}", "bad_number")
        elif p == "index":
            if isinstance(v, str) and v.strip().isdigit():
                v = int(v.strip())
            if type(v) is not int or not 0 <= v < _MAX_TAB:
                raise ActionParseError(f"tab_focus() takes a tab's index from the Tabs list such as tab_focus(0), "
                                       f"got {_snippet(str(v))}", "bad_number")
        elif p == "options":
            if isinstance(v, list):
                if not v or not all(isinstance(o, (str, int, float)) for o in v):
                    raise ActionParseError("select_option() takes an option text or a non-empty list of "
                                           "option texts, e.g. select_option('9', 'Blue')", "bad_options")
                v = [_number_text(e, src) if isinstance(o, (int, float)) else o for e, o in zip(node.elts, v)]
            elif isinstance(v, (int, float)):
                v = _number_text(node, src)
        else:  # value, key_comb, text
            if isinstance(v, list):
                raise ActionParseError(f"{name}() argument {p} must be a string, got a list", "bad_text")
            if isinstance(v, (int, float)):
                v = _number_text(node, src)
            if p in ("key_comb", "key"):
                try:
                    v = canonical_keys(v, name)
                except ValueError as e:
                    raise ActionParseError(str(e), "bad_key") from None
            elif p == "url" and not v.strip():
                raise ActionParseError("goto() takes a URL such as goto('http://shop.example/'), got an empty one",
                                       "bad_text")
        out.append(v)
    return canonical(name, out)


def _signature_example(name: str) -> str:
    return {"fill": "fill('14', 'text')", "select_option": "select_option('9', 'Blue')",
            "press": "press('14', 'Enter')", "scroll": "scroll(0, 300)",
            "send_msg_to_user": "send_msg_to_user('42')", "goto": "goto('http://shop.example/')",
            "tab_focus": "tab_focus(0)", "keyboard_press": "keyboard_press('Enter')",
            "keyboard_down": "keyboard_down('Shift')", "keyboard_up": "keyboard_up('Shift')",
            "keyboard_type": "keyboard_type('text')", "keyboard_insert_text": "keyboard_insert_text('text')",
            "report_infeasible": "report_infeasible('why')"}.get(name, f"{name}('12')")


def split_action(action: str) -> tuple[str, list]:
    """A canonical action string -> (name, positional args): "fill('14', 'x')" -> ("fill", ["14", "x"]).
    Only for parse_action's own output (other text may raise SyntaxError, AttributeError or
    ActionParseError). Inverse of canonical."""
    call = ast.parse(action, mode="eval").body
    return call.func.id, [_literal(a) for a in call.args]
