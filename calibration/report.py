"""Calibration results as data: the ``--json`` document, a Markdown summary, and the PNG plot.

The paper's section 7 reference numbers (Xen 3.1 credit scheduler, 1 to 10
DGEMM VMs on one CPU) are kept here so every report can put ours beside them.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict
from typing import Any

import numpy as np

from calibration.experiment import Result
from calibration.stats import window_rates
from hypervisor.files import write_figure
from vcsched.errors import InputError

# Paper section 7 (Xen 3.1): overhead 0.27% average slowdown; absolute error 0.72% average,
# 5.99% worst; a new cap takes effect in under one second.
XEN_OVERHEAD = 0.0027
XEN_MEAN_ERROR = 0.0072
XEN_WORST_ERROR = 0.0599
XEN_RESPONSE_S = 1.0


def result_to_dict(result: Result, conditions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``--json`` document: every measured number, units in the key names."""
    cfg = result.config
    return {
        "backend": result.backend,
        "resource": result.resource,
        "unit": result.unit,
        "cpu": result.cpu,
        "config": {
            "caps": list(cfg.caps),
            "workers": cfg.workers,
            "duration_s": cfg.duration,
            "tolerance": cfg.tolerance,
            "steps": list(cfg.steps),
            "window_s": cfg.window,
            "confirm_s": cfg.effective_confirm,
            "pairs": cfg.pairs,
        },
        "conditions": conditions or {},
        "bare": asdict(result.bare),
        "bare_before": asdict(result.bare_before) if result.bare_before else None,
        "bare_after": asdict(result.bare_after) if result.bare_after else None,
        "bare_drift": result.bare_drift,
        "uncapped": asdict(result.uncapped),
        "overhead_pairs": [
            {"bare": asdict(b) if b else None, "uncapped": asdict(u) if u else None}
            for b, u in itertools.zip_longest(result.bare_runs, result.uncapped_runs)
        ],
        "overhead": {"rate": result.rate_overhead, "share": result.share_overhead},
        "error": {
            "rate": {"mean": result.rate_error.mean, "max": result.rate_error.worst, "count": result.rate_error.count},
            "share": {
                "mean": result.share_error.mean,
                "max": result.share_error.worst,
                "count": result.share_error.count,
            },
        },
        "runs": [
            {
                "workers": r.workers,
                "cap": r.cap,
                "expected": asdict(r.expected),
                "measured": [asdict(m) for m in r.measured],
                "rate_errors": list(r.rate_errors),
                "share_errors": list(r.share_errors),
            }
            for r in result.runs
        ],
        "steps": [
            {
                "from_cap": s.from_cap,
                "to_cap": s.to_cap,
                "at_s": s.at,
                "rate_response_s": s.rate_response,
                "share_response_s": s.share_response,
                "rate_in_band": s.rate_in_band,
                "share_in_band": s.share_in_band,
            }
            for s in result.steps
        ],
        "xen_reference": {
            "overhead": XEN_OVERHEAD,
            "mean_error": XEN_MEAN_ERROR,
            "max_error": XEN_WORST_ERROR,
            "response_s_below": XEN_RESPONSE_S,
        },
    }


def rate_text(x: float) -> str:
    """DGEMM/s in the tens of thousands, vCPU s/s around 1: enough digits for both."""
    return f"{x:.1f}" if abs(x) >= 100 else f"{x:.4f}"


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}%"


def seconds(x: float | None, in_band: float | None = None) -> str:
    """A response time (and how much of the hold was in band); ``None``: never settled during the hold."""
    text = "not settled" if x is None else f"{x:.2f} s"
    return text if in_band is None else f"{text} ({100 * in_band:.0f}% in band)"


def summary_rows(result: Result) -> list[tuple[str, str, str, str]]:
    """(quantity, ours on work rate, ours on CPU share, Xen in the paper) — shared by the CLI and the docs."""
    up = [s for s in result.steps if s.to_cap > s.from_cap]
    down = [s for s in result.steps if s.to_cap < s.from_cap]
    overhead = ("overhead (uncapped slowdown)" if result.resource == "cpu"
                else "uncapped runs vs the reference (drift, not an overhead)")
    rows = [
        (overhead, pct(result.rate_overhead), pct(result.share_overhead), pct(XEN_OVERHEAD)),
        ("mean absolute error", pct(result.rate_error.mean), pct(result.share_error.mean), pct(XEN_MEAN_ERROR)),
        ("max absolute error", pct(result.rate_error.worst), pct(result.share_error.worst), pct(XEN_WORST_ERROR)),
    ]
    for label, steps in (("response, cap up", up), ("response, cap down", down)):
        for s in steps:
            rows.append(
                (
                    f"{label} {s.from_cap:g}→{s.to_cap:g}",
                    seconds(s.rate_response, s.rate_in_band),
                    seconds(s.share_response, s.share_in_band),
                    "< 1 s",
                )
            )
    return rows


def markdown(result: Result, conditions: dict[str, Any] | None = None) -> str:
    """A Markdown summary and per-cap table, for docs/calibration.md."""
    lines = [
        f"Backend `{result.backend}`, CPU {result.cpu}, {result.config.workers} worker(s) max, "
        f"{result.config.duration:g} s per measurement, tolerance ±{100 * result.config.tolerance:g}%, "
        f"window {result.config.window:g} s, settled = in band for "
        f"{'the rest of the hold' if (c := result.config.effective_confirm) is None else f'{c:g} s'}.",
    ]
    if conditions:
        lines.append("Conditions: " + ", ".join(f"{k} {v}" for k, v in conditions.items()) + ".")
    drift = result.bare_drift
    lines += [
        f"Bare rate {rate_text(result.bare.rate)} {result.unit}"
        + (f" (drift start→end {100 * drift:+.2f}%)" if drift is not None else " (nominal)")
        + ".",
        "",
        "| quantity | work rate | CPU share | Xen 3.1 (paper) |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in summary_rows(result)]
    lines += [
        "",
        "| workers | cap | expected rate | measured rate (each) | rate error (max) "
        "| CPU share (each) | share error (max) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result.runs:
        rates = ", ".join(rate_text(m.rate) for m in r.measured)
        shares = ", ".join(f"{m.share:.4f}" for m in r.measured)
        lines.append(
            f"| {r.workers} | {r.cap:g} | {rate_text(r.expected.rate)} | {rates} | {pct(max(r.rate_errors))} "
            f"| {shares} | {pct(max(r.share_errors))} |"
        )
    return "\n".join(lines) + "\n"


def require_matplotlib(path: str) -> None:
    """Fail before a long run rather than after it when the plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(
            f"--plot {path}: matplotlib is not installed (pip install 'vcsched[plot]' or pip install matplotlib)"
        ) from None


#: Axis labels by resource: what the caps are fractions of, and what "share" measures.
_AXES = {
    "cpu": ("cap (fraction of one CPU)", "work rate / bare rate", "CPU share"),
    "disk": ("cap (fraction of one guest's uncapped disk rate)", "disk bytes/s / reference", "disk bytes/s"),
    "net": ("cap (fraction of one guest's uncapped receive rate)", "bytes received/s / reference",
            "bytes received/s"),
}


def plot(result: Result, path: str, resource: str | None = None) -> None:
    """Two panels: measured vs expected per cap, and the rate through the cap steps (needs matplotlib)."""
    resource = resource or result.resource
    require_matplotlib(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (acc, resp) = plt.subplots(1, 2, figsize=(11, 4.2))
    caps = np.array([r.cap for r in result.runs for _ in r.measured])
    rates = np.array([m.rate / result.bare.rate for r in result.runs for m in r.measured])
    shares = np.array([m.share for r in result.runs for m in r.measured])
    xlabel, rate_label, share_label = _AXES.get(resource, _AXES["cpu"])
    acc.plot([0, 1], [0, 1], color="grey", lw=1, label="expected (cap)")
    acc.scatter(caps, rates, marker="o", s=22, label=rate_label)
    if resource == "cpu":  # for disk and network, work and share are the same bytes
        acc.scatter(caps, shares, marker="x", s=22, label=share_label)
    acc.set_xlabel(xlabel)
    acc.set_ylabel("achieved (fraction of bare)" if resource == "cpu" else "achieved (fraction of the reference)")
    acc.set_title(f"accuracy ({result.backend}, {resource}, {len({r.workers for r in result.runs})} "
                  "concurrency levels)")
    if resource != "cpu":
        acc.set_xlim(0, max(caps) * 1.15)
        acc.set_ylim(0, max(max(caps), float(rates.max())) * 1.15)
    acc.legend(loc="upper left", fontsize=8)

    cfg = result.config
    end = result.step_cpu.times[-1]
    series = [(result.step_work, result.bare.rate, rate_label)]
    if resource == "cpu":
        series.append((result.step_cpu, 1.0, share_label))
    for trace, scale, label in series:
        starts, r = window_rates(trace, trace.times[0], end, cfg.window, cfg.stride)
        resp.plot(starts + cfg.window / 2, r / scale, lw=1, label=label)
    lo, hi = cfg.steps
    marks = [0.0] + [s.at for s in result.steps] + [end]
    targets = [lo] + [s.to_cap for s in result.steps]
    for (a, b), c in zip(itertools.pairwise(marks), targets, strict=True):
        resp.hlines(c, a, b, colors="grey", linestyles="dashed", lw=1)
        resp.fill_between([a, b], c * (1 - cfg.tolerance), c * (1 + cfg.tolerance), color="grey", alpha=0.15)
    for s in result.steps:
        resp.axvline(s.at, color="black", lw=0.6)
    resp.set_xlabel("seconds")
    resp.set_ylabel(f"{cfg.window:g} s window average (centred)")
    resp.set_title(f"cap steps {lo:g} ↔ {hi:g} (band: ±{100 * cfg.tolerance:g}%)")
    resp.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    write_figure("--plot", path, fig, dpi=110)

