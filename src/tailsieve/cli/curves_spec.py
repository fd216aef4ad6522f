"""`tailsieve curves --spec`: each built-in speculation profile's speedup against concurrency on its reference curve,
beside the published points it was fitted to or must contain (docs/speculative.md)."""

from __future__ import annotations

from typing import Any

from tailsieve.model.curve_names import load_curve
from tailsieve.model.spec_calibration import PROFILE_METHODS, crossing, point_depth, profile, speedup
from tailsieve.model.spec_records import Bracket, Family, Metric, Use, points
from tailsieve.model.speculative import SpecConfig
from tailsieve.model.suffix_model import DraftSource, PoolSources, pool_spec, source_table, suffix_points

SUFFIX_DEPTH = 4  # the depth the suffix profiles are tabulated at (the comparison's usual best)
SUFFIX_POOLS = (("cut work (tail pool)", (DraftSource.CUT,)),
                ("prompt only (fresh)", ()))
SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
LABEL = 38  # first column width: the whole table stays within 100 columns


def profile_doc() -> dict[str, Any]:
    """Every profile's constants and S(b), and every speedup point, as JSON."""
    out = []
    for m in PROFILE_METHODS:
        for f in Family:
            for b in Bracket:
                p = profile(m, f, b)
                out.append({"name": p.name, "reference_curve": p.reference_curve, "spec": p.spec.to_json(),
                            "speedup": {str(n): speedup(p.spec, p.curve, n) for n in SIZES},
                            "crossing": crossing(p.spec, p.curve)})
    pts = [{"id": x.id, "method": x.method.value, "family": x.family.value, "use": x.use.value,
            "concurrency": x.concurrency, "depth": x.depth, "value": x.value, "source": x.source}
           for m in PROFILE_METHODS for x in points(m) if x.metric is Metric.SPEEDUP]
    return {"profiles": out, "points": pts, "suffix": suffix_doc()}


def lines() -> list[str]:
    """The text tables: per method and family, three profile rows, then the published points at their concurrency."""
    head = f"{'':<{LABEL}}" + "".join(f"{'b=' + str(n):>7}" for n in SIZES) + f"{'S = 1 at':>10}"
    out: list[str] = []
    for m in PROFILE_METHODS:
        for f in Family:
            out += ["", f"{m.value}, {f.value} (reference curve {profile(m, f, Bracket.CENTRAL).reference_curve}): "
                        "speedup S(b) at the profile's depth", head]
            for b in Bracket:
                p = profile(m, f, b)
                cross = crossing(p.spec, p.curve)
                where = "never" if cross is None else ("b = 1" if cross == 1.0 else f"{cross:.1f}")
                out.append(f"{p.name + f' (d={p.spec.depth})':<{LABEL}}"
                           + "".join(f"{speedup(p.spec, p.curve, n):>7.2f}" for n in SIZES) + f"{where:>10}")
            for x in points(m, f):
                if x.metric is not Metric.SPEEDUP:
                    continue
                tag = {Use.CENTRAL: "fit", Use.RANGE: "range", Use.CHECK: "check"}.get(x.use, x.use.value)
                label = f"  {x.id} [{tag}{'' if x.depth is None else f', d={point_depth(x)}'}]"
                cells = "".join(f"{x.value:>7.2f}" if x.concurrency == n else f"{'':>7}" for n in SIZES)
                out.append((f"{label:<{LABEL}}{cells}" + ("" if x.concurrency is not None else
                                                          f"  {x.value:.2f} (b not stated)")).rstrip())
    return out + suffix_lines()


def _suffix_profiles() -> list[tuple[str, Bracket, SpecConfig]]:
    return [(label, b, pool_spec(PoolSources.of(src), b, SUFFIX_DEPTH)) for label, src in SUFFIX_POOLS for b in Bracket]


def suffix_doc() -> dict[str, Any]:
    """The suffix profiles' S(b) at SUFFIX_DEPTH on the dense reference curve, the sources' constants and points."""
    curve = load_curve(profile(PROFILE_METHODS[0], Family.DENSE, Bracket.CENTRAL).reference_curve)
    profs = [{"name": label, "bracket": b.value, "spec": s.to_json(),
              "speedup": {str(n): speedup(s, curve, n) for n in SIZES}} for label, b, s in _suffix_profiles()]
    pts = [{"id": p.id, "draft_source": p.draft_source.value, "metric": p.metric, "use": p.use,
            "concurrency": p.concurrency, "value": p.value, "source": p.source} for p in suffix_points()]
    return {"depth": SUFFIX_DEPTH, "reference_curve": curve.name, "profiles": profs, "sources": source_table(),
            "points": pts}


def suffix_lines() -> list[str]:
    """Suffix profiles per draft source and bracket, then every published suffix point beside them."""
    doc = suffix_doc()
    head = f"{'':<{LABEL}}" + "".join(f"{'b=' + str(n):>7}" for n in SIZES)
    out = ["", f"suffix (reference curve {doc['reference_curve']}): speedup S(b) at depth {doc['depth']}", head]
    for p in doc["profiles"]:
        out.append(f"{p['name'][:LABEL - 10] + ' ' + p['bracket']:<{LABEL}}"
                   + "".join(f"{p['speedup'][str(n)]:>7.2f}" for n in SIZES))
    for x in doc["points"]:
        label = f"  {x['id']} [{x['use']}, {x['draft_source']}]"[:LABEL]
        if x["metric"] == "speedup" and x["concurrency"] in SIZES:
            cells = "".join(f"{x['value']:>7.2f}" if x["concurrency"] == n else f"{'':>7}" for n in SIZES)
            out.append(f"{label:<{LABEL}}{cells}".rstrip())
        else:
            where = "" if x["concurrency"] is None else f" at b={x['concurrency']}"
            out.append(f"{label:<{LABEL}}  {x['metric']} {x['value']:g}{where}")
    for r in doc["sources"]:
        out.append(f"  source {r['source']} {r['bracket']}: α={r['acceptance']:.3f}, p={r['draft_share']:.3f}, "
                   f"ā(4)={r['expected_tokens']['4']:.2f}")
    return out
