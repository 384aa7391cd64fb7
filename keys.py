"""Keyboard keys: a key combination as a model writes it -> the one Playwright's press() takes.

    from keys import canonical_keys
    canonical_keys("ctrl+a")    # -> 'Control+a'
    canonical_keys(" ")         # -> 'Space'
    canonical_keys("Hyper")     # ValueError: press() got unknown key 'Hyper' in 'Hyper': use a key name ...

actions.parse_action calls it on press()'s and keyboard_press()'s argument, so a key the browser
would not know is an error the agent sees, not a Playwright exception mid-step. Pure text.
"""
from __future__ import annotations


def _snippet(s: str, limit: int = 60) -> str:
    return repr(s if len(s) <= limit else s[:limit] + "...")


# The keys Playwright's press() knows (its US keyboard layout, Playwright 1.44): key codes and names,
# and single characters: printable ASCII, '\n' and '\r' (Enter). tests/test_actions.py checks this
# list against the installed Playwright's own.
NAMED_KEYS = frozenset(
    ["Alt", "AltGraph", "AltLeft", "AltRight", "ArrowDown", "ArrowLeft", "ArrowRight", "ArrowUp", "Backquote",
     "Backslash", "Backspace", "BracketLeft", "BracketRight", "CapsLock", "Comma", "ContextMenu", "Control",
     "ControlLeft", "ControlOrMeta", "ControlRight", "Delete", "End", "Enter", "Equal", "Escape", "Home", "Insert",
     "Meta", "MetaLeft", "MetaRight", "Minus", "NumLock", "NumpadAdd", "NumpadDecimal", "NumpadDivide",
     "NumpadEnter", "NumpadMultiply", "NumpadSubtract", "PageDown", "PageUp", "Pause", "Period", "PrintScreen",
     "Quote", "ScrollLock", "Semicolon", "Shift", "ShiftLeft", "ShiftRight", "Slash", "Space", "Tab"]
    + [f"Digit{i}" for i in range(10)] + [f"Numpad{i}" for i in range(10)] + [f"F{i}" for i in range(1, 13)]
    + [f"Key{chr(c)}" for c in range(ord("A"), ord("Z") + 1)])
KEY_CHARS = frozenset(map(chr, range(0x20, 0x7F))) | {"\n", "\r"}
# A key as models write it -> Playwright's name: names in any case, a few common short names, and the
# characters that name a key better than they show it
KEY_ALIASES = {**{k.lower(): k for k in NAMED_KEYS}, "ctrl": "Control", "esc": "Escape", "return": "Enter",
               "del": "Delete", "cmd": "Meta"}
KEY_CHAR_NAMES = {" ": "Space", "\n": "Enter", "\r": "Enter"}


def canonical_keys(key_comb: str, action: str = "press") -> str:
    """A press() (or keyboard_press(), ...: `action`, for the message) key combination as Playwright takes
    it: keys joined by '+' (split as Playwright splits
    them: 'Control++' is Control then '+'), each a key name ('Enter', 'ArrowLeft', 'KeyA', 'F5',
    'Shift', 'ControlOrMeta'; any case, or 'ctrl', 'esc', 'return', 'del', 'cmd') or one printable ASCII
    character. ' ' is 'Space', a newline 'Enter'. canonical_keys(' ') -> 'Space', 'control+a' -> 'Control+a'.
    Errors: ValueError naming the key Playwright would not know (actions.parse_action shows it to
    the agent as an ActionParseError of kind bad_key)."""
    keys, building = [], ""
    for c in key_comb:  # Playwright's split (server/input.js)
        if c == "+" and building:
            keys.append(building)
            building = ""
        else:
            building += c
    keys.append(building)
    out = []
    for k in keys:
        name = KEY_CHAR_NAMES.get(k) or (k if k in KEY_CHARS else KEY_ALIASES.get(k.strip().lower()))
        if name is None:
            what = "an empty key" if not k.strip() else f"unknown key {_snippet(k)}"
            raise ValueError(f"{action}() got {what} in {_snippet(key_comb)}: use a key name such as 'Enter', "
                             f"'Space', 'Tab', 'ArrowDown', 'Backspace', one character such as 'a', or a "
                             f"combination such as 'Control+a'")
        out.append(name)
    return "+".join(out)
