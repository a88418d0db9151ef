"""The GPU staging plot of the report (matplotlib, rendered to PNG bytes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from release.report.staging_record import StagingRecord


def block_size_label(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def staging_plot(staging: StagingRecord) -> bytes:
    """GB/s against block size, one line per method and direction (the C++ bench's rates),
    ceilings dotted (PNG)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(9, 5.2), dpi=110)
    methods = list(dict.fromkeys(row.method for row in staging.rates))
    colours = pyplot.get_cmap("tab10").colors
    for index, method in enumerate(methods):
        rows = sorted((r for r in staging.rates if r.method == method), key=lambda r: r.block_bytes)
        sizes = [r.block_bytes for r in rows]
        colour = colours[index % len(colours)]
        axes.plot(sizes, [r.h2d_gbps for r in rows], "o-", color=colour, label=f"{method} H2D")
        axes.plot(
            sizes,
            [r.d2h_gbps for r in rows],
            "s--",
            color=colour,
            label=f"{method} D2H",
            alpha=0.8,
        )
    ceilings: dict[float, list[str]] = {}
    for direction, value in staging.ceiling_gbps.items():
        ceilings.setdefault(float(value), []).append(direction.upper())
    for value, directions in ceilings.items():
        axes.axhline(value, color="grey", linestyle=":", linewidth=1)
        axes.annotate(
            f"{'/'.join(directions)} copy ceiling {value:g} GB/s",
            (0.01, value),
            xycoords=("axes fraction", "data"),
            textcoords="offset points",
            xytext=(0, 3),
            fontsize=8,
            color="dimgrey",
        )
    sizes = sorted({r.block_bytes for r in staging.rates})
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes, [block_size_label(s) for s in sizes])
    axes.set_xlabel("block size")
    axes.set_ylabel("GB/s")
    highest = max([*ceilings, *(max(r.h2d_gbps, r.d2h_gbps) for r in staging.rates)])
    axes.set_ylim(0, highest * 1.12)
    gpu = "?" if staging.gpu is None else staging.gpu
    axes.set_title(f"Staging bandwidth on {gpu}", fontsize=11)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=len(methods))
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    pyplot.close(figure)
    return buffer.getvalue()
