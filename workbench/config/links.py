"""An emulated network's links as the configuration gives them (`RunConfig.emulate_link`), parsed and checked
before launch; comm/emulated_link.py holds messages for the times they say."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    bandwidth_GBps: float
    latency_us: float

    def seconds(self, nbytes: float) -> float:
        """latency + bytes / bandwidth."""
        return self.latency_us * 1e-6 + nbytes / (self.bandwidth_GBps * 1e9)


def parse_links(spec: str) -> dict[str, Link]:
    """'inter=12.5,5;intra=100,1' → {'inter': Link(12.5, 5.0), 'intra': Link(100.0, 1.0)}; ValueError
    naming the bad part and the expected form."""
    form = "'inter=BW_GBps,LATENCY_us;intra=BW_GBps,LATENCY_us' (either part may be left out)"
    links: dict[str, Link] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, values = part.partition("=")
        try:
            bw, lat = (float(v) for v in values.split(","))
        except ValueError:
            raise ValueError(
                f"emulate_link part {part!r}: expected NAME=BW_GBps,LATENCY_us; the whole: {form}"
            ) from None
        if name.strip() not in ("inter", "intra") or bw <= 0 or lat < 0:
            raise ValueError(
                f"emulate_link part {part!r}: the links are 'inter' and 'intra', with bandwidth > 0 "
                f"and latency ≥ 0; the whole: {form}"
            )
        links[name.strip()] = Link(bw, lat)
    if not links:
        raise ValueError(f"emulate_link={spec!r} names no link; expected {form}")
    return links
