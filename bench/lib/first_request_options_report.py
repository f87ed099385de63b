"""--mode options' figures: one class's requests on one server (ClassResult), the per-class
summary over the N servers (each server's first/steady ratio, the median of those ratios, and
the median first over the median of every server's steady requests), and the table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

# decode_step_s, the mean step after the first token, tells a first-use cost in the decode
# steps from a request that only took more steps (fewer drafts accepted, a longer output).
ATTRS = ("ttft_s", "total_s", "server_ttft_s", "decode_step_s")


@dataclass
class Timed:
    ttft_s: float
    total_s: float
    server_ttft_s: float
    tokens: int
    finish_reason: str
    steps: int  # the server's count: every step the request took part in, prefill included
    decode_step_s: float  # (total_s - ttft_s) / the steps after the first token's


@dataclass
class ClassResult:
    """One class on one server: its first request after ready and the steady ones."""

    name: str
    first: Timed | None = None
    steady: list[Timed] = field(default_factory=list)
    compiles_after_ready: float = 0.0
    graph_misses_after_ready: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.first is not None and bool(self.steady)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(t, attr) for t in self.steady)

    def ratio(self, attr: str) -> float:
        assert self.first is not None
        return float(getattr(self.first, attr)) / self.median(attr)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"class": self.name, "error": self.error,
                               "compiles_after_ready": self.compiles_after_ready,
                               "graph_misses_after_ready": self.graph_misses_after_ready}
        if self.ok:
            assert self.first is not None
            out.update({
                "first": vars(self.first), "steady": [vars(t) for t in self.steady],
                **{f"{a}_ratio": round(self.ratio(a), 4) for a in ATTRS},
                **{f"steady_median_{a}": round(self.median(a), 6) for a in (*ATTRS, "tokens")}})
        return out


def summarise(name: str, per_server: list[ClassResult]) -> dict[str, Any]:
    """Class `name` over the servers (per_server in server order): each server's ratio (None
    where its run of the class failed), the median of the ratios, and med/med: the median of
    the N first requests over the median of all N x steady requests. Compiles and misses are
    summed over the servers."""
    ok = [r for r in per_server if r.ok]
    out: dict[str, Any] = {
        "class": name, "servers": len(per_server), "servers_ok": len(ok),
        "error": "; ".join(f"server {i + 1}: {r.error}"
                           for i, r in enumerate(per_server) if r.error),
        "compiles_after_ready": sum(r.compiles_after_ready for r in per_server),
        "graph_misses_after_ready": sum(r.graph_misses_after_ready for r in per_server)}
    if not ok:
        return out
    firsts = [r.first for r in ok if r.first is not None]
    steady = [t for r in ok for t in r.steady]
    for a in (*ATTRS, "tokens", "steps"):
        out[f"first_median_{a}"] = round(statistics.median(getattr(t, a) for t in firsts), 6)
        out[f"steady_median_{a}"] = round(statistics.median(getattr(t, a) for t in steady), 6)
    for a in ATTRS:
        out[f"{a}_ratios"] = [round(r.ratio(a), 4) if r.ok else None for r in per_server]
        out[f"{a}_ratio_median"] = round(statistics.median(r.ratio(a) for r in ok), 4)
        out[f"{a}_med_over_med"] = round(out[f"first_median_{a}"] / out[f"steady_median_{a}"], 4)
    return out


def worst(classes: list[dict[str, Any]], attr: str) -> dict[str, Any] | None:
    """The class with the highest median first/steady ratio of `attr`."""
    ok = [c for c in classes if f"{attr}_ratio_median" in c]
    if not ok:
        return None
    top = max(ok, key=lambda c: c[f"{attr}_ratio_median"])
    return {"class": top["class"], "ratio_median": top[f"{attr}_ratio_median"],
            "med_over_med": top[f"{attr}_med_over_med"]}


def print_table(report: dict[str, Any]) -> None:
    s, servers = report["setup"], report["servers"]
    n = len(servers)
    print(f"first request per option after ready / steady median: {s['model_dir']} on "
          f"{s['device']} ({s['attention_backend']}), k={s['num_speculative_steps']}, prompt "
          f"{s['prompt_len']}, max_tokens {s['max_tokens']}, temperature {s['temperature']:g}, "
          f"{s['steady']} steady per class, {s['gap_s']:g} s idle before each; {n} fresh "
          f"server(s){', class order shuffled per server' if s['shuffle'] else ''}")
    for i, srv in enumerate(servers):
        print(f"server {i + 1}: ready in {srv['ready_s']:.1f} s; phases: "
              + ", ".join(f"{p} {st}" for p, st in srv["phases"].items()))
        if s["shuffle"]:
            print(f"  order: {','.join(srv['order'])}")
    print(f"first = median of the {n} first requests, steady = median of all {n} x "
          f"{s['steady']} steady ones, m/m = first / steady, r_med = median of the {n} "
          "servers' first/steady ratios, step = the mean decode step after the first token; "
          "tokens and steps first/steady medians; compiles and misses summed over the servers")
    print(f"{'class':<19} {'ttft_first':>10} {'ttft_med':>9} {'m/m':>5} {'r_med':>5}   "
          f"{'total_first':>11} {'total_med':>9} {'m/m':>5} {'r_med':>5}   {'srv_r_med':>9} "
          f"{'step_r_med':>10} {'tokens':>7} {'steps':>7} {'compiles':>8} {'misses':>6}")
    for c in report["classes"]:
        if "ttft_s_ratio_median" not in c:
            print(f"{c['class']:<19} error: {c['error']}")
            continue
        print(f"{c['class']:<19} {c['first_median_ttft_s'] * 1e3:>10.2f} "
              f"{c['steady_median_ttft_s'] * 1e3:>9.2f} {c['ttft_s_med_over_med']:>5.2f} "
              f"{c['ttft_s_ratio_median']:>5.2f}   {c['first_median_total_s'] * 1e3:>11.2f} "
              f"{c['steady_median_total_s'] * 1e3:>9.2f} {c['total_s_med_over_med']:>5.2f} "
              f"{c['total_s_ratio_median']:>5.2f}   {c['server_ttft_s_ratio_median']:>9.2f} "
              f"{c['decode_step_s_ratio_median']:>10.2f} "
              f"{c['first_median_tokens']:>3g}/{c['steady_median_tokens']:<3g} "
              f"{c['first_median_steps']:>3g}/{c['steady_median_steps']:<3g} "
              f"{c['compiles_after_ready']:>8g} {c['graph_misses_after_ready']:>6g}")
    print(f"per server first/steady (servers 1-{n}): TTFT | whole request")
    for c in report["classes"]:
        if "ttft_s_ratios" in c:
            print(f"{c['class']:<19} " + " | ".join(
                " ".join("  -  " if r is None else f"{r:5.2f}" for r in c[f"{a}_ratios"])
                for a in ("ttft_s", "total_s")))
    w_ttft, w_total = report["worst"]["ttft_s"], report["worst"]["total_s"]
    w_step = report["worst"]["decode_step_s"]
    if w_ttft and w_total and w_step:
        print(f"worst first/steady by the median of {n} ratios: TTFT {w_ttft['ratio_median']:.2f} "
              f"({w_ttft['class']}), whole request {w_total['ratio_median']:.2f} "
              f"({w_total['class']}), decode step {w_step['ratio_median']:.2f} "
              f"({w_step['class']})")
    print(f"compiles_after_ready: {report['compiles_after_ready']:g}")
    print(f"cuda_graph_misses_after_ready: {report['graph_misses_after_ready']:g}")
