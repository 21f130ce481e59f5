"""What the bench writes for people: the Markdown document (title, run
metadata, a GB/s table with footnoted reasons) and the PNG plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .workloads import COPY_TRANSFERS, FIGURES, WORKLOADS, Row


class Footnotes:
    """Numbered Markdown footnotes, one per distinct reason."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    def mark(self, reason: str) -> str:
        """The marker of `reason` ("[^n]"), numbering it on first use."""
        reason = " ".join(reason.split())  # one line, whatever the error said
        n = self.numbers.setdefault(reason, len(self.numbers) + 1)
        return f"[^{n}]"

    def lines(self) -> list[str]:
        """The footnote definitions, in number order."""
        return [f"[^{n}]: {text}" for text, n in self.numbers.items()]


def peer_timer(results: list[Row]) -> str:
    """What the peers' one figure is in these rows: "device" or "wall"."""
    peers = [r for r in results if not r.is_graph and r.gbps]
    return "device" if any(r.extra.get("timer") == "device" for r in peers) else "wall"


def comparable(row: Row, timer: str) -> float | None:
    """The GB/s of `row` to set beside the peers' figure of kind `timer`: a
    MAX graph's device figure under the device timer, else its headline."""
    if row.is_graph and timer == "device":
        if row.device_gbps is not None:
            return row.device_gbps
        return row.gbps if row.extra.get("timer") == "device" else None  # older files
    return row.gbps


def peer_replayed(row: Row) -> bool:
    """Whether peer `row` got (or tried) a replay figure: a torch peer on a
    GPU, its K calls captured in a torch CUDA graph (`extra["replay"]`)."""
    return not row.is_graph and (bool(row.extra.get("replay")) or row.replay_gbps is not None)


def _columns(results: list[Row]) -> list[tuple[str, str | None]]:
    """(provider, figure) per column: three for a MAX graph, one for a peer
    (its timed figure) and a second where it was replayed."""
    cols: list[tuple[str, str | None]] = []
    for p in dict.fromkeys(r.provider for r in results):
        mine = [r for r in results if r.provider == p]
        if any(r.is_graph for r in mine):
            cols += [(p, f) for f in FIGURES]
        else:
            cols.append((p, None))
            if any(peer_replayed(r) for r in mine):
                cols.append((p, "replay"))
    return cols


def gbps_text(gbps: float) -> str:
    """GB/s as the table shows it: whole numbers, one decimal below 10."""
    return f"{gbps:.0f}" if gbps >= 10 else f"{gbps:.1f}"


def _cell(row: Row | None, figure: str | None, notes: Footnotes) -> str:
    """One GB/s cell; a missing value shows why in a footnote."""
    if row is None:
        return "—"
    which = figure or "exec"
    gbps = row.figure(which)[1]
    if gbps is not None:
        caveat = row.note if which == "exec" else ""
        return gbps_text(gbps) + (notes.mark(caveat) if caveat else "")
    if which != "exec" and (row.ok is False or row.note.startswith("error")):
        return "—"  # nothing was timed: the exec cell says why
    reason = row.why_missing(which)
    symbol = "✗" if row.ok is False else ("err" if reason.startswith("error") else "n/a")
    return symbol + notes.mark(reason)


def _time_vs_copy(op: str) -> tuple[str, float] | None:
    """(column head, ours' transfers / the copy's) where `op`'s workload has
    a target for ours' time against the copy's; None where it has none."""
    workload = WORKLOADS.get(op)
    if workload is None or workload.copy_time_target is None:
        return None
    head = f"ours time / copy (target <= {workload.copy_time_target:g})"
    return head, workload.transfers / COPY_TRANSFERS


def table(results: list[Row], op: str = "softmax") -> str:
    """Markdown table: GB/s per provider (a MAX graph's three figures side
    by side; a peer's timed figure, and its replay where it was replayed),
    then ours % of the copy roof, ours / best peer (ours' figure comparable
    to the peers' timed one), ours' replay / the best peer's replay (where
    peers were replayed), ours' time over the copy's (where `op`'s workload
    has a target for it); below it a footnote for every value that is
    missing or in doubt."""
    cols = _columns(results)
    providers = list(dict.fromkeys(p for p, _ in cols))
    peers = [p for p in providers if not p.startswith("ours") and p != "copy"]
    timer = peer_timer(results)
    vs_copy = _time_vs_copy(op)
    replays = any(peer_replayed(r) for r in results)  # replay vs replay, like for like
    head = [p if f is None else f"{p} {f}" for p, f in cols]
    ours_fig = "device" if timer == "device" else "exec"
    lead = (
        "ours" if "ours" in providers else next((p for p in providers if p.startswith("ours")), "")
    )
    if lead and not any(r.is_graph for r in results if r.provider == lead):
        ours_fig = f"({lead}) wall"  # ours timed as a peer is: e.g. ours:numpy on the CPU
    head += ["ours % of copy", f"ours {ours_fig} / best peer {timer}"]
    head += ["ours replay / best peer replay"] if replays else []
    head += [vs_copy[0]] if vs_copy else []
    lines = ["| dtype | rows x N | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 2)]
    notes = Footnotes()
    for key in dict.fromkeys(r.shape_key for r in results):
        by = {r.provider: r for r in results if r.shape_key == key}
        ours = by.get("ours") or next(
            (by[p] for p in providers if p.startswith("ours") and p in by), None
        )
        mine = comparable(ours, timer) if ours else None
        roof = by["copy"].gbps if "copy" in by else None
        best = max((comparable(by[p], timer) or 0 for p in peers if p in by), default=0)
        pct = f"{100 * mine / roof:.0f}%" if mine and roof else "—"
        ratio = f"{mine / best:.2f}x" if mine and best else "—"
        cells = [_cell(by.get(p), f, notes) for p, f in cols] + [pct, ratio]
        if replays:
            mine_r = ours.replay_gbps if ours else None
            best_r = max((by[p].replay_gbps or 0 for p in peers if p in by), default=0)
            cells.append(f"{mine_r / best_r:.2f}x" if mine_r and best_r else "—")
        if vs_copy:  # time ratio = (bytes ours moves / the copy's) x copy GB/s / ours' GB/s
            cells.append(f"{vs_copy[1] * roof / mine:.2f}x" if mine and roof else "—")
        lines.append(f"| {key[0]} | {key[1]} x {key[2]} | " + " | ".join(cells) + " |")
    foot = notes.lines()
    return "\n".join(lines + ([""] + foot if foot else []))


def legend(results: list[Row], op: str) -> str:
    """What the table's figures are, in a few sentences (first what a call
    of the workload is and what its GB/s counts, where that needs saying)."""
    workload = WORKLOADS.get(op)
    transfers = workload.transfers if workload else 2
    timer = peer_timer(results)
    peer = "GPU busy time (CUPTI)" if timer == "device" else "marginal wall-clock time"
    ours = "device" if timer == "device" else "exec"
    if workload and workload.bytes_note:
        what = f"{workload.bytes_note} Copy: 2 x tensor bytes / time."
    else:
        what = f"GB/s = {transfers} x tensor bytes / time (copy: 2 x)."
    replayed = any(peer_replayed(r) for r in results)
    text = (
        f"{what} MAX graphs (ours, "
        "ours:<variant>, max.ops.softmax) have three figures: **exec**, the K-op graph "
        "executed (marginal wall time per op, the headline); **replay**, the same graph "
        "captured once and replayed (marginal wall time per op, as exec); **device**, GPU "
        "busy time (CUPTI). "
        f"Peers have one timed figure: {peer}"
    )
    if replayed:
        text += (
            "; torch peers on a GPU also have a **replay**: their K calls captured once in a torch "
            "CUDA graph and replayed (marginal wall time per call), as ours is"
        )
    names = list(dict.fromkeys(r.provider for r in results))
    lead = "ours" if "ours" in names else next((p for p in names if p.startswith("ours")), "")
    if lead and not any(r.is_graph for r in results if r.provider == lead):
        ours = f"({lead}) wall"  # ours timed as a peer is: e.g. ours:numpy on the CPU
        text += f". 'ours % of copy' and 'ours {ours} / best peer {timer}' use {lead}'s figure"
    else:
        text += f". 'ours % of copy' and 'ours {ours} / best peer {timer}' use ours' {ours} figure"
    if replayed:
        text += "; 'ours replay / best peer replay' sets replay against replay"
    return text + "."


def document(results: list[Row], meta: dict[str, Any]) -> str:
    """The Markdown file: a title, the run as a short bullet list, the
    legend, the table and its footnotes."""
    op = meta.get("op", "softmax")
    device = meta.get("device", "?")
    lines = [f"# softmax bench: {op} on {device}", ""]
    kind = meta.get("device_kind") or meta.get("kind")
    facts = [
        ("date", meta.get("date")),
        ("commit", meta.get("commit")),
        ("device", f"{device} ({kind})" if kind else device),
        ("command", f"`{meta['command']}`" if meta.get("command") else None),
        ("method", meta.get("method")),
    ]
    lines += [f"- {name}: {value}" for name, value in facts if value]
    lines += ["", legend(results, op), "", table(results, op), ""]
    return "\n".join(lines)


def _series(rows: list[Row], which: str, where: dict) -> list[tuple[int, float, bool]]:
    """(x, GB/s, reliable) of one figure along the shapes; unreliable points
    use the rough value kept in extra["rough"]."""
    pts = []
    for r in rows:
        gbps = r.figure(which)[1]
        rough = r.extra.get("rough", {}).get(which)
        if gbps is not None:
            pts.append((where[(r.n, r.rows)], gbps, True))
        elif rough:
            pts.append((where[(r.n, r.rows)], rough, False))
    return sorted(pts)


def _draw(ax: Any, pts: list[tuple[int, float, bool]], label: str, style: dict) -> None:
    """One curve: a line through every point, filled markers where reliable,
    hollow where not."""
    if not pts:
        ax.plot([], [], label=f"{label} (no data)", **style)
        return
    marker = style.get("marker") or "o"
    line_style = {k: v for k, v in style.items() if k != "marker"}
    (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **line_style)
    color = line.get_color()
    for reliable in (True, False):
        sub = [p for p in pts if p[2] is reliable]
        if sub:
            face = color if reliable else "none"
            ax.plot(
                [p[0] for p in sub],
                [p[1] for p in sub],
                linestyle="none",
                marker=marker,
                color=color,
                markerfacecolor=face,
            )


def plot(results: list[Row], path: Path, op: str = "softmax") -> bool:
    """GB/s per provider at each shape, shapes sorted by row length N (one
    panel per dtype, titled by `op`): every provider's comparable figure,
    plus ours' other figures dashed. False (nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    timer = peer_timer(results)
    main_fig = "device" if timer == "device" else "exec"
    dtypes = sorted({r.dtype for r in results})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(8 * len(dtypes), 5.5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        mine = [r for r in results if r.dtype == dtype]
        shapes = sorted({(r.n, r.rows) for r in mine})
        where = {s: i for i, s in enumerate(shapes)}
        for p in dict.fromkeys(r.provider for r in mine):
            rows = [r for r in mine if r.provider == p]
            graph = any(r.is_graph for r in rows)
            which = main_fig if graph else "exec"
            style: dict = {"marker": "o" if p.startswith("ours") else "^", "alpha": 0.85}
            if p == "copy":
                style = {"color": "black", "linestyle": "--", "marker": "d"}
            _draw(ax, _series(rows, which, where), f"{p} ({which})" if graph else p, style)
            if p == "ours":
                for other in (f for f in FIGURES if f != which):
                    pts = _series(rows, other, where)
                    if pts:
                        _draw(ax, pts, f"ours ({other})", {"linestyle": ":", "marker": "s"})
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"{rows}x{n}" for n, rows in shapes], rotation=45, ha="right")
        ax.set_xlabel("rows x N (sorted by row length N); hollow marker: unreliable")
        ax.set_ylabel("GB/s (bytes that must move / time)")
        ax.set_title(f"{op} {dtype}, {results[0].device}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
