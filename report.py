"""See what the agent did: one self-contained HTML report of trajectories, real and imagined.

    import report
    report.write_report("runs/bc/final/report", trajs, summary, metrics_path="runs/bc/metrics.jsonl")
    report.plot_curves("runs/real/metrics.jsonl", "/tmp/curves")       # PNGs of every logged key

    python eval.py --ckpt runs/bc/final --seeds 2 --report runs/bc/final/report   # evaluate, then report
    python report.py runs/bc/final/eval/trajectories.jsonl --out /tmp/rep         # from saved trajectories

The report (DIR/report.html) holds: success per task (stats.summarise's table), training curves from
a train.py metrics.jsonl, then a sample of episodes, failures first, spread over tasks. Each step
shows the page's screenshot (trajectories collected with WebEnv(screenshots=True); rollout.py stores
them base64 under turn["screenshot"] and traj["final_screenshot"]), the model's reply, the parsed
action or the error, and the observation text (folded). Dream trajectories (source "dream") show the
imagined observation beside the real one replayed from the same actions (turn["real_observation"],
when present), differing lines highlighted, and the world model's predicted success beside the
replay's real success. Images are embedded as data: URIs: the file needs no network, CSS or script
from elsewhere. Page text and model output are untrusted: everything is HTML-escaped.
"""
from __future__ import annotations

import argparse
import base64
import difflib
import html
import math
import os
import re
import sys
from collections import OrderedDict

import stats
from runlog import open_text, read_jsonl

# train.py's headline metrics, plotted first (any other numeric key follows, in file order)
CURVE_KEYS = ["rollout/reward", "rollout/success", "loss/policy", "loss/clip_frac", "loss/kl", "loss/bc", "loss/wm"]
MAX_TEXT_CHARS = 20_000  # longer observations / replies are cut in the report (keeps 50 episodes small)
_B64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


def _esc(x) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _cut(s: str, limit: int = MAX_TEXT_CHARS) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= limit else s[:limit] + f"\n... ({len(s) - limit} more characters)"


def _img_src(shot, mime: str = "image/jpeg") -> str | None:
    """A data: URI for a screenshot given as base64 text (trajectory records) or bytes; None if invalid."""
    if not shot:
        return None
    if isinstance(shot, (bytes, bytearray)):
        shot = base64.b64encode(bytes(shot)).decode("ascii")
    if not isinstance(shot, str) or not _B64.match(shot):
        return None
    return f"data:{mime};base64,{shot}"


def _img(shot, alt: str, cls: str = "shot") -> str:
    src = _img_src(shot)
    if src is None:
        return f'<div class="{cls} noshot">no screenshot</div>'
    return f'<img class="{cls}" src="{src}" alt="{_esc(alt)}">'


# ----------------------------------------------------------------------------------------------
# Which episodes


def outcome(t: dict) -> str:
    """'env_error', 'success' or 'fail'."""
    return "env_error" if t.get("env_error") else ("success" if t.get("success") else "fail")


def select_episodes(trajectories: list[dict], max_episodes: int = 50) -> list[dict]:
    """At most `max_episodes` trajectories: failures first, then env errors, then successes; within
    each, round-robin over tasks (each task's episodes in their given order), so that a cap keeps
    every task in view."""
    picked: list[dict] = []
    for kind in ("fail", "env_error", "success"):
        by_task: OrderedDict[str, list[dict]] = OrderedDict()
        for t in trajectories:
            if t is not None and outcome(t) == kind:
                by_task.setdefault(str(t.get("task", "")), []).append(t)
        queues = [list(v) for v in by_task.values()]
        while queues and len(picked) < max_episodes:
            for q in queues:
                if q and len(picked) < max_episodes:
                    picked.append(q.pop(0))
            queues = [q for q in queues if q]
    return picked


# ----------------------------------------------------------------------------------------------
# Curves


def read_metrics(metrics_path: str) -> list[dict]:
    """The records of a train.py metrics.jsonl that have a numeric 'step' (runlog.read_jsonl: a cut
    last line is skipped)."""
    return [r for r in read_jsonl(metrics_path) if isinstance(r, dict) and isinstance(r.get("step"), (int, float))]


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def plot_curves(metrics_path: str, out_dir: str, keys: list[str] | None = None) -> list[str]:
    """One PNG per metric (value against step) in out_dir, named curve_<key>.png ('/' -> '_');
    returns their paths. keys: default every numeric key in the file (CURVE_KEYS first), except
    'step' and 'time'. Keys that never occur are skipped. Uses matplotlib's Agg canvas (no display,
    no global backend switch)."""
    from matplotlib.figure import Figure  # lazy: matplotlib costs ~0.3 s to import
    from matplotlib.ticker import MaxNLocator

    rows = read_metrics(metrics_path)
    present: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k not in ("step", "time") and _numeric(v) and k not in present:
                present.append(k)
    if keys is None:
        keys = [k for k in CURVE_KEYS if k in present] + [k for k in present if k not in CURVE_KEYS]
    else:
        keys = [k for k in keys if k in present]
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for k in keys:
        pts = sorted((r["step"], float(r[k])) for r in rows if _numeric(r.get(k)))
        if not pts:
            continue
        xs, ys = zip(*pts)
        fig = Figure(figsize=(3.6, 2.3), dpi=80)
        ax = fig.subplots()
        ax.plot(xs, ys, lw=1.2, marker="o" if len(xs) <= 30 else None, ms=2.5, color="#1f5fa8")
        if len(ys) > 30:  # a moving average over the noisy raw line
            w = max(2, len(ys) // 20)
            finite = [y if math.isfinite(y) else float("nan") for y in ys]
            ma = [sum(finite[max(0, i - w + 1):i + 1]) / len(finite[max(0, i - w + 1):i + 1]) for i in range(len(finite))]
            ax.lines[0].set_alpha(0.35)
            ax.plot(xs, ma, lw=1.5, color="#1f5fa8")
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        path = os.path.join(out_dir, "curve_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", k) + ".png")
        fig.savefig(path)
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------------------------
# HTML pieces


CSS = """
body{font-family:system-ui,Arial,sans-serif;margin:16px;color:#222;max-width:1200px}
h1{font-size:20px}h2{font-size:17px;margin-top:28px}h3{font-size:15px;margin:0 0 6px}
table.summary{border-collapse:collapse;font-size:13px;display:inline-table;margin:0 16px 8px 0;vertical-align:top}
table.summary caption{text-align:left;font-size:12px;color:#555}
table.summary td,table.summary th{border:1px solid #ccc;padding:3px 8px;text-align:right}
table.summary td:first-child,table.summary th:first-child{text-align:left}
.bar{display:inline-block;height:9px;background:#4a8;vertical-align:middle;margin-right:4px}
.curves img{margin:4px;border:1px solid #ddd}
section.episode{border:1px solid #bbb;border-radius:6px;padding:10px;margin:14px 0}
section.episode.fail{border-left:6px solid #c33}section.episode.success{border-left:6px solid #3a3}
section.episode.env_error{border-left:6px solid #999}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;color:#fff;margin-left:6px}
.badge.fail{background:#c33}.badge.success{background:#3a3}.badge.env_error{background:#888}
.badge.dream{background:#75b}.badge.real{background:#368}.badge.expert{background:#a70}
.meta{font-size:13px;color:#444;margin:4px 0 8px}
.step{display:flex;gap:12px;border-top:1px dashed #ddd;padding:8px 0}
.shot{width:160px;height:210px;flex:none;border:1px solid #ccc}
.noshot{display:flex;align-items:center;justify-content:center;color:#999;font-size:12px;background:#f6f6f6}
.turn{flex:1;min-width:0;font-size:13px}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:6px;margin:4px 0;font-size:12px}
.action{color:#164;font-family:monospace}.error{color:#b22;font-family:monospace;white-space:pre-wrap}
details summary{cursor:pointer;color:#555;font-size:12px}
table.diff{border-collapse:collapse;width:100%;font-size:11px;font-family:monospace;table-layout:fixed}
table.diff td,table.diff th{border:1px solid #e3e3e3;padding:1px 4px;vertical-align:top;white-space:pre-wrap;word-break:break-word}
td.chg{background:#fff3b0}td.only{background:#ffd6d6}td.gap{background:#eee}
.index{font-size:12px;columns:3}.index a{text-decoration:none}
"""


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def summary_table(summary: dict, caption: str = "") -> str:
    """stats.summarise's dict as an HTML table (success, 95% CI, n, env_error, mean steps)."""
    out = ["<table class='summary'>"]
    if caption:
        out.append(f"<caption>{_esc(caption)}</caption>")
    out.append("<tr><th>task</th><th>success</th><th>95% CI</th><th>n</th><th>env_error</th><th>mean steps</th></tr>")
    for task, r in (summary.get("tasks") or {}).items():
        s = r.get("success")
        lo, hi = (r.get("ci95") or [0.0, 1.0])[:2]
        bar = f"<span class='bar' style='width:{int(round(60 * s))}px'></span>" if s is not None else ""
        out.append(f"<tr><td>{_esc(task)}</td><td>{bar}{_pct(s)}</td><td>{lo:.0%}-{hi:.0%}</td>"
                   f"<td>{_esc(r.get('n', ''))}</td><td>{_esc(r.get('env_error', ''))}</td>"
                   f"<td>{float(r.get('mean_steps') or 0):.1f}</td></tr>")
    m = summary.get("mean")
    if m:
        lo, hi = (m.get("ci95") or [0.0, 1.0])[:2]
        tm = m.get("task_mean")
        out.append(f"<tr><th>all</th><th>{'n/a' if m.get('success') is None else format(m['success'], '.1%')}</th>"
                   f"<th>{lo:.0%}-{hi:.0%}</th><th>{_esc(m.get('n', ''))}</th><th>{_esc(m.get('env_error', ''))}</th>"
                   f"<th>{'' if tm is None else 'task mean ' + format(tm, '.1%')}</th></tr>")
    out.append("</table>")
    return "\n".join(out)


def diff_table(imagined: str, real: str) -> tuple[str, int]:
    """Side-by-side line diff (imagined | real) as an HTML table, and the number of differing rows."""
    a, b = (imagined or "").split("\n"), (real or "").split("\n")
    rows, ndiff = [], 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            rows += [f"<tr><td>{_esc(x)}</td><td>{_esc(x)}</td></tr>" for x in a[i1:i2]]
            continue
        la, lb = a[i1:i2], b[j1:j2]
        for k in range(max(len(la), len(lb))):
            ndiff += 1
            l = la[k] if k < len(la) else None
            r = lb[k] if k < len(lb) else None
            cls = "chg" if l is not None and r is not None else "only"
            lc = f"<td class='{cls}'>{_esc(l)}</td>" if l is not None else "<td class='gap'></td>"
            rc = f"<td class='{cls}'>{_esc(r)}</td>" if r is not None else "<td class='gap'></td>"
            rows.append(f"<tr>{lc}{rc}</tr>")
    head = "<tr><th>imagined (world model)</th><th>real (replayed on the page)</th></tr>"
    return f"<table class='diff'>{head}{''.join(rows)}</table>", ndiff


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _yes_no(x) -> str:
    return "n/a" if x is None else ("yes" if x else "no")


def episode_html(t: dict, idx: int) -> str:
    """One <section class="episode ..."> for a trajectory record."""
    kind = outcome(t)
    source = str(t.get("source", "real"))
    dream = source == "dream"
    head = (f"<h3>#{idx} {_esc(t.get('task', '?'))} seed {_esc(t.get('seed', '?'))}"
            f"<span class='badge {_esc(kind)}'>{_esc(kind)}</span>"
            f"<span class='badge {_esc(source)}'>{_esc(source)}</span></h3>")
    meta = [f"reward {float(t.get('reward') or 0):g}", f"success {_yes_no(t.get('success'))}",
            f"env_error {_yes_no(bool(t.get('env_error')))}", f"steps {_esc(t.get('steps', len(t.get('turns') or [])))}"]
    if "predicted_success" in t or "real_success" in t:
        ps, rs = t.get("predicted_success"), t.get("real_success")
        agree = "" if ps is None or rs is None else (" (agree)" if bool(ps) == bool(rs) else " (<b>disagree</b>)")
        meta.append(f"world model predicted success <b>{_yes_no(ps)}</b> / real replay success <b>{_yes_no(rs)}</b>{agree}")
    parts = [f"<section class='episode {_esc(kind)}' id='ep-{idx}' data-task='{_esc(t.get('task', ''))}' "
             f"data-outcome='{_esc(kind)}' data-source='{_esc(source)}'>", head,
             f"<div class='meta'>goal: <b>{_esc(t.get('goal', ''))}</b><br>{' &middot; '.join(meta)}</div>"]
    if t.get("error"):
        parts.append(f"<div class='error'>episode error: {_esc(_cut(t['error'], 2000))}</div>")
    turns = t.get("turns") or []
    shots = any(u.get("screenshot") for u in turns)  # dreams have none: no empty picture frames
    for k, u in enumerate(turns):
        turn = [f"<div class='turn'><b>step {k + 1}</b>"]
        turn.append(f"<pre class='response'>{_esc(_cut(u.get('response', '')))}</pre>")
        if u.get("action"):
            turn.append(f"<div class='action'>action: {_esc(u['action'])}</div>")
        elif not u.get("error"):
            turn.append("<div class='action'>action: (none)</div>")
        if u.get("error"):
            turn.append(f"<div class='error'>error: {_esc(_cut(u['error'], 2000))}</div>")
        if u.get("truncated"):
            turn.append("<div class='meta'>(reply cut at max_new_tokens)</div>")
        obs = _cut(u.get("observation", ""))
        real = u.get("real_observation")
        if dream and real is not None:
            table, nd = diff_table(obs, _cut(real))
            note = "identical" if nd == 0 else ("1 line differs" if nd == 1 else f"{nd} lines differ")
            turn.append(f"<details class='obs'><summary>observation: imagined vs real ({note})</summary>{table}</details>")
        else:
            label = "imagined observation (no real replay)" if dream else "observation"
            turn.append(f"<details class='obs'><summary>{label}</summary><pre>{_esc(obs)}</pre></details>")
        turn.append("</div>")
        img = _img(u.get("screenshot"), f"step {k + 1}") if shots else ""
        parts.append(f"<div class='step'>{img}{''.join(turn)}</div>")
    if t.get("final_screenshot"):
        parts.append(f"<div class='step'>{_img(t['final_screenshot'], 'final page')}"
                     f"<div class='turn'><b>final page</b> &middot; {_esc(kind)}, reward {float(t.get('reward') or 0):g}</div></div>")
    parts.append("</section>")
    return "\n".join(parts)


def _summaries(trajectories: list[dict]) -> list[tuple[str, dict]]:
    """stats.summarise per source (one table when every trajectory has the same source)."""
    trajs = [t for t in trajectories if t is not None]
    by_source: OrderedDict[str, list[dict]] = OrderedDict()
    for t in trajs:
        by_source.setdefault(str(t.get("source", "real")), []).append(t)
    out = []
    for source, ts in by_source.items():
        tasks = list(OrderedDict.fromkeys(str(t.get("task", "")) for t in ts))
        rows = [{"task": str(t.get("task", "")), "success": bool(t.get("success")), "env_error": bool(t.get("env_error")),
                 "steps": int(t.get("steps", len(t.get("turns") or [])) or 0)} for t in ts]
        out.append((source if len(by_source) > 1 else "", stats.summarise(rows, tasks)))
    return out


def write_report(out_dir: str, trajectories: list[dict], summary: dict | None = None, metrics_path: str | None = None,
                 title: str = "", max_episodes: int = 50) -> str:
    """Write out_dir/report.html (self-contained) and return its path.

    trajectories: rollout.py records (real, dream or expert). summary: stats.summarise's dict; None:
    computed from the trajectories (one table per source). metrics_path: a train.py metrics.jsonl;
    when it exists, its curves are plotted (PNGs in out_dir, also embedded in the HTML).
    max_episodes: how many episodes are shown (failures first, spread over tasks)."""
    os.makedirs(out_dir, exist_ok=True)
    trajectories = [t for t in trajectories if t is not None]
    title = title or "webdream report"
    body = [f"<h1>{_esc(title)}</h1>"]
    n_ok = sum(1 for t in trajectories if outcome(t) == "success")
    n_err = sum(1 for t in trajectories if outcome(t) == "env_error")
    n_fail = len(trajectories) - n_ok - n_err
    body.append(f"<div class='meta'>{_count(len(trajectories), 'episode')}: {_count(n_ok, 'success', 'successes')}, "
                f"{_count(n_fail, 'failure')}, {_count(n_err, 'env error')}</div>")

    body.append("<h2>Success per task</h2>")
    tables = [("", summary)] if summary is not None else _summaries(trajectories)
    for caption, s in tables:
        body.append(summary_table(s, caption=f"source: {caption}" if caption else ""))
    if summary is not None:
        extra = [f"{k}: {_esc(summary[k] if not isinstance(summary[k], float) else round(summary[k], 1))}"
                 for k in ("model", "seconds", "real_steps") if k in summary]
        if extra:
            body.append(f"<div class='meta'>{' &middot; '.join(extra)}</div>")
    dreams = [t for t in trajectories if t.get("source") == "dream"
              and t.get("predicted_success") is not None and t.get("real_success") is not None]
    if dreams:
        agree = sum(bool(t["predicted_success"]) == bool(t["real_success"]) for t in dreams)
        fp = sum(bool(t["predicted_success"]) and not t["real_success"] for t in dreams)
        body.append(f"<div class='meta'>dreams replayed on real pages: {len(dreams)}; the world model's predicted "
                    f"success agrees with the real one in {agree} ({agree / len(dreams):.0%}); "
                    f"predicted success that really failed: {fp}</div>")

    if metrics_path and os.path.exists(metrics_path):
        try:
            pngs = plot_curves(metrics_path, out_dir)
        except Exception as e:  # a report without curves beats no report
            pngs = []
            body.append(f"<div class='error'>could not plot {_esc(metrics_path)}: {_esc(e)}</div>")
        if pngs:
            body.append(f"<h2>Training curves</h2><div class='meta'>{_esc(metrics_path)}</div><div class='curves'>")
            for p in pngs:
                with open(p, "rb") as f:
                    src = _img_src(f.read(), "image/png")
                body.append(f"<img src='{src}' alt='{_esc(os.path.basename(p))}'>")
            body.append("</div>")

    shown = select_episodes(trajectories, max_episodes)
    body.append(f"<h2>Episodes</h2><div class='meta'>{len(shown)} of {len(trajectories)} shown: failures first, "
                f"then env errors, then successes, spread over tasks</div>")
    body.append("<ol class='index'>" + "".join(
        f"<li><a href='#ep-{i}'>{_esc(t.get('task', '?'))} {_esc(t.get('seed', ''))} ({_esc(outcome(t))})</a></li>"
        for i, t in enumerate(shown, 1)) + "</ol>")
    body += [episode_html(t, i) for i, t in enumerate(shown, 1)]

    doc = ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
           "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'\">"
           f"<title>{_esc(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    path = os.path.join(out_dir, "report.html")
    with open_text(path, "w") as f:
        f.write(doc)
    return path


def load_trajectories(paths: list[str]) -> list[dict]:
    """Every record of some trajectories.jsonl files."""
    return [t for p in paths for t in read_jsonl(p)]


def due(every: int, it: int, last: int) -> bool:
    """Whether a training run writes its report after iteration `it` (1-based): every `every`
    iterations and at the last (never when every is 0)."""
    return bool(every) and (it % every == 0 or it == last)


def write_run_report(out: str, trajectories: list[dict], it: int, mode: str) -> None:
    """A training run's report, out/report/report.html: this iteration's trajectories (rank 0's share)
    and the run's curves so far. A report is for people: a failure is printed, never raised."""
    try:
        write_report(os.path.join(out, "report"), trajectories, metrics_path=os.path.join(out, "metrics.jsonl"),
                     title=f"{out}: iteration {it} ({mode} mode)")
    except Exception as e:
        print(f"warning: report at iteration {it} failed: {type(e).__name__}: {e}", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trajectories", nargs="+", help="trajectories.jsonl file(s) (eval.py, train.py)")
    p.add_argument("--out", required=True, help="output folder: report.html (+ curve PNGs)")
    p.add_argument("--metrics", default=None, help="a train.py metrics.jsonl to plot")
    p.add_argument("--title", default="", help="report title")
    p.add_argument("--max-episodes", type=int, default=50, help="episodes shown")
    a = p.parse_args(argv)
    path = write_report(a.out, load_trajectories(a.trajectories), metrics_path=a.metrics, title=a.title,
                        max_episodes=a.max_episodes)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
