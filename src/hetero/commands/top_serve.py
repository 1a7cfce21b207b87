"""``hetero top --serve URL``: the replicas of a running ``hetero serve``, from its ``/status``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from hetero._tables import FitTable

__all__ = ["fetch_status", "serve_view", "watch_serve"]

_TEXT = ("replica", "state", "engine", "models", "load")
_COLUMNS = (*_TEXT, "speed", "run", "queue", "slots", "done", "fail", "tok/s", "latency")
_STATE_STYLE = {
    "up": "green",
    "busy": "yellow",
    "draining": "yellow",
    "failing": "red",
    "gray": "red",
    "down": "red",
}


def fetch_status(url: str, key: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """``GET URL/status`` (with the admin ``key``: every field; without, what is public);
    ``OSError`` with a readable message when the router cannot be read."""
    target = url.rstrip("/") + "/status"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(target, headers=headers), timeout=timeout
        ) as reply:
            data = json.loads(reply.read())
    except (urllib.error.URLError, ValueError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OSError(f"cannot read {target}: {reason}") from None
    if not isinstance(data, dict) or "replicas" not in data:
        raise OSError(f"{target} is not a hetero serve status (no 'replicas')")
    return data


def serve_view(
    status: dict[str, Any], url: str, rates: dict[str, float] | None = None
) -> RenderableType:
    """The router's totals and a table of its replicas; ``rates``: output tokens/s each since
    the previous view. Without them (one view: ``--once``, or the first of a watch) a replica's
    rate is its output tokens over the router's uptime, which ``/status`` gives: a single read
    has no other, and a dash there would say nothing is known when the tokens are."""
    head = Text(
        f"hetero serve {url} · strategy {status['strategy']} · up {status['uptime_s']:.0f}s"
        f"{' · shutting down' if status.get('closing') else ''}\n"
        f"requests: {status['active']:,} active, {status['waiting']:,} waiting in the router "
        f"(of {status['queue_size']:,})"
    )
    table = FitTable(
        caption="speed: learned / declared per request (V100 = 1.0); slots: learned capacity; "
        "load: the engine's running + waiting requests and KV cache use; tok/s: output tokens "
        "per second "
        + ("since the last refresh" if rates is not None else "since the router started")
        + "; latency: mean seconds",
        caption_justify="left",
    )
    for header in _COLUMNS:
        table.add_column(header, justify="left" if header in _TEXT else "right")
    for r in status["replicas"]:
        style = _STATE_STYLE.get(r["state"], "white")
        rate = rates.get(r["name"]) if rates is not None else _mean_rate(r, status)
        latency = r.get("mean_latency_s")
        table.add_row(
            Text(r["name"]),
            Text(r["state"], style=style),
            Text(r.get("engine", "—")),
            Text(",".join(r["models"]) or "—"),
            _load_text(r.get("load")),
            f"{r['learned_speed']:.2f} / " + ("—" if r["speed"] is None else f"{r['speed']:.2f}"),
            f"{r['in_flight']:,}",
            f"{r['queued']:,}",
            f"{r['slots']:,}",
            f"{r['completed']:,}",
            f"{r['failed']:,}",
            _rate_text(rate),
            "—" if latency is None else f"{latency:.2f}",
        )
    parts: list[RenderableType] = [head, table]
    engines = _engine_table(status["replicas"])
    if engines is not None:
        parts.append(engines)
    if status.get("autoscale"):
        parts.append(_autoscale_table(status["autoscale"]))
    return Group(*parts)


def _mean_rate(replica: dict[str, Any], status: dict[str, Any]) -> float | None:
    """Output tokens per second over the router's uptime (None: not known)."""
    tokens, uptime = replica.get("output_tokens"), status.get("uptime_s")
    if not isinstance(tokens, int | float) or not isinstance(uptime, int | float) or uptime <= 0:
        return None
    return tokens / uptime


def _rate_text(rate: float | None) -> str:
    if rate is None:
        return "—"
    return f"{rate:,.1f}" if rate < 10 else f"{rate:,.0f}"


def _autoscale_table(auto: dict[str, Any]) -> FitTable:
    """``--autoscale``: per type its replicas and target, then the last decisions."""
    traffic = auto.get("traffic") or {}
    dry = " (dry run)" if auto["dry_run"] else ""
    table = FitTable(
        title=f"autoscale{dry}: {traffic.get('rate', 0):.2f} requests/s over the last "
        f"{traffic.get('window', 0):.0f} s",
        caption="target: what the planner asks for now (within min/max); held: why a wanted "
        "action waits. Last decisions: "
        + (
            "; ".join(
                f"{d['kind']} {d['type']} {d['ago_s']:.0f}s ago: {d['reason']}"
                for d in auto["decisions"][-3:]
            )
            or "none yet"
        ),
        caption_justify="left",
    )
    for header in ("type", "warm", "starting", "draining", "target", "min–max"):
        table.add_column(header, justify="left" if header == "type" else "right")
    table.add_wrapping_column("held", width=24)
    for name, t in auto["types"].items():
        table.add_row(
            name,
            str(t["warm"]),
            str(t["starting"]),
            str(t["draining"]),
            str(t.get("target", "—")),
            f"{t.get('min_count', 0)}–{t.get('max_count', '—')}",
            t.get("held") or "",
        )
    return table


def _engine_table(replicas: list[dict[str, Any]]) -> FitTable | None:
    """Strategy slo: each replica's fitted engine, its predictions for a typical request
    beside the SLO, and how far off its predictions were (None under other strategies)."""
    fitted = [r for r in replicas if r.get("engine_model")]
    if not fitted:
        return None
    sources = Counter(r["engine_model"].get("slo_from") for r in fitted)
    sources.pop(None, None)
    derived = (
        "; the SLO derived from each replica's lone times, held (from "
        + ", ".join(f"{source} ×{n}" for source, n in sorted(sources.items()))
        + ")"
        if sources
        else ""
    )
    table = FitTable(
        caption="engine model (strategy slo): prefill tokens/s and step ms (alone + per "
        "request) as fitted; TTFT / TPOT predicted for a 512-token prompt now, beside the "
        f"SLO{derived}; error: |predicted / measured - 1| of the replies, p50 / p90",
        caption_justify="left",
    )
    for header in ("replica", "prefill/s", "step ms", "TTFT s", "TPOT ms", "err TTFT", "err TPOT"):
        table.add_column(header, justify="left" if header == "replica" else "right")
    for r in fitted:
        m = r["engine_model"]
        slo = m["slo"]
        prefill = m["prefill_tokens_per_s"]
        most = m.get("most_running")  # the slow start's, or the limit learned past it
        tags = [
            tag
            for tag, on in (
                ("distrusted", m["distrusted"]),
                ("widened", m.get("widened")),
                ("full" if most is None else f"full at {most:g}", m.get("slow_start_full")),
            )
            if on
        ]
        table.add_row(
            Text(
                r["name"] + (f" ({', '.join(tags)})" if tags else ""),
                style="red" if m.get("widened") else "yellow" if tags else "",
            ),
            "—" if prefill is None else f"{prefill:,.0f}",
            f"{1000 * m['step_base_s']:.1f} + {1000 * m['step_per_request_s']:.2f}",
            f"{m['predicted_ttft_s']:.2f} / {slo['ttft_s']:.2f}",
            f"{1000 * m['predicted_tpot_s']:.1f} / {1000 * slo['tpot_s']:.1f}",
            _errors(m["error_ttft"]),
            _errors(m["error_tpot"]),
        )
    return table


def _errors(e: dict[str, float | None]) -> str:
    if e["p50"] is None:
        return "—"
    return f"{e['p50']:.0%} / {e['p90']:.0%}"


def _load_text(load: dict[str, Any] | None) -> Text:
    if not load:
        return Text("—")
    if not load.get("known"):
        why = str(load.get("why", ""))
        return Text(f"unknown: {why[:40]}{'…' if len(why) > 40 else ''}", style="yellow")
    parts = [f"{load.get('running', '?')} + {load.get('waiting', '?')}"]
    if load.get("kv_usage") is not None:
        parts.append(f"kv {load['kv_usage']:.0%}")
    return Text(" · ".join(parts))


def watch_serve(out: Console, url: str, interval: float, key: str | None = None) -> None:
    """Redraw every ``interval`` seconds until Ctrl-C; token rates from successive polls."""
    last: dict[str, int] = {}
    last_at = 0.0
    try:
        with Live(console=out, auto_refresh=False) as live:
            while True:
                status = fetch_status(url, key)
                now = time.monotonic()
                tokens = {r["name"]: r["output_tokens"] for r in status["replicas"]}
                rates = (
                    {k: (v - last.get(k, v)) / (now - last_at) for k, v in tokens.items()}
                    if last_at
                    else None
                )
                last, last_at = tokens, now
                live.update(serve_view(status, url, rates), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        return
